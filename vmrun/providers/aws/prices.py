"""What an instance costs per hour, in USD: on-demand from the AWS Price List API, spot
from the zone's latest spot price.

A price is a courtesy of `vmrun clusters`, never a reason for it to fail: any failure (no
`pricing:GetProducts` permission, no answer, an answer vmrun cannot read) is None, shown as
"-". Answers are cached in `$XDG_CACHE_HOME/vmrun/prices.json` (on-demand a day, spot an
hour), so listing again is as fast as listing once; failures are not cached.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

# The Price List API answers in these regions only; us-east-1 has every region's prices.
PRICING_REGION = "us-east-1"
ON_DEMAND_TTL = 24 * 3600.0
SPOT_TTL = 3600.0
CACHE_FILE = "prices.json"
# The product vmrun launches: Linux, shared tenancy, no pre-installed software, and the
# "Used" capacity status (the others are reservations' bookkeeping rows).
PRODUCT_FILTERS = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
}


def cache_path(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CACHE_HOME") or str(
        Path(environ.get("HOME") or os.path.expanduser("~")) / ".cache"
    )
    return Path(base) / "vmrun" / CACHE_FILE


def on_demand_filters(instance_type: str, region: str) -> list[dict[str, str]]:
    wanted = {"instanceType": instance_type, "regionCode": region, **PRODUCT_FILTERS}
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in wanted.items()]


def parse_on_demand(price_list: list[Any]) -> float | None:
    """The hourly USD price in a `get_products` PriceList (JSON strings, one per product):
    the first nonzero OnDemand price per hour; None when there is none."""
    for item in price_list:
        product = json.loads(item) if isinstance(item, str) else item
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            for dim in term.get("priceDimensions", {}).values():
                usd = dim.get("pricePerUnit", {}).get("USD")
                if usd is not None and str(dim.get("unit", "Hrs")).lower().startswith("hr"):
                    value = float(usd)
                    if value > 0:
                        return value
    return None


def query_on_demand(pricing: Any, instance_type: str, region: str) -> float | None:
    """Ask the Price List API (raises what botocore raises)."""
    answer = pricing.get_products(
        ServiceCode="AmazonEC2",
        Filters=on_demand_filters(instance_type, region),
        FormatVersion="aws_v1",
        MaxResults=10,
    )
    return parse_on_demand(answer.get("PriceList", []))


def query_spot(ec2: Any, instance_type: str, zone: str) -> float | None:
    """The zone's latest Linux spot price for the type (raises what botocore raises)."""
    answer = ec2.describe_spot_price_history(
        InstanceTypes=[instance_type],
        AvailabilityZone=zone,
        ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
        StartTime=datetime.now(timezone.utc),
        MaxResults=20,
    )
    rows = [
        r
        for r in answer.get("SpotPriceHistory", [])
        if r.get("AvailabilityZone") == zone and r.get("InstanceType") == instance_type
    ]
    if not rows:
        return None
    latest = max(
        rows, key=lambda r: r.get("Timestamp") or datetime.min.replace(tzinfo=timezone.utc)
    )
    return float(latest["SpotPrice"])


class Prices:
    """Hourly prices for one listing: each asked once, from the cache where it is fresh.
    `session`: a vmrun.providers.aws.session.Session; `save()` writes what was learnt."""

    def __init__(
        self,
        session: Any,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._session = session
        self._path = cache_path(environ)
        self._clock = clock
        self._cache = _load(self._path)
        self._asked: dict[str, float | None] = {}
        self._learnt = False
        self._pricing_refused = False

    def on_demand(self, instance_type: str, region: str) -> float | None:
        key = f"on-demand/{region}/{instance_type}"
        if self._pricing_refused:
            return None

        def ask() -> float | None:
            pricing = self._session.client("pricing", PRICING_REGION)
            return query_on_demand(pricing, instance_type, region)

        return self._price(key, ON_DEMAND_TTL, ask)

    def spot(self, instance_type: str, zone: str, region: str) -> float | None:
        if not zone:
            return None
        key = f"spot/{zone}/{instance_type}"

        def ask() -> float | None:
            return query_spot(self._session.client("ec2", region), instance_type, zone)

        return self._price(key, SPOT_TTL, ask)

    def hourly(self, instance_type: str, region: str, zone: str, spot: bool) -> float | None:
        if spot:
            return self.spot(instance_type, zone, region)
        return self.on_demand(instance_type, region)

    def _price(self, key: str, ttl: float, ask: Callable[[], float | None]) -> float | None:
        if key in self._asked:
            return self._asked[key]
        cached = self._cache.get(key)
        now = self._clock()
        if cached is not None and 0 <= now - cached[1] < ttl:
            self._asked[key] = cached[0]
            return cached[0]
        try:
            price = ask()
        except Exception as exc:  # a price is never worth a failure: shown as unknown
            from vmrun.providers.aws.session import error_code

            if key.startswith("on-demand/") and (
                error_code(exc) in ("AccessDeniedException", "AccessDenied")
                or type(exc).__name__ in ("NoCredentialsError", "EndpointConnectionError")
            ):
                self._pricing_refused = True  # the same answer for every other type
            self._asked[key] = None
            return None
        self._asked[key] = price
        self._cache[key] = (price, now)
        self._learnt = True
        return price

    def save(self) -> None:
        """Write the cache (best effort: a cache that cannot be written is only slower)."""
        if not self._learnt:
            return
        data = {k: [p, t] for k, (p, t) in self._cache.items()}
        tmp = self._path.with_name(f".{self._path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data, sort_keys=True) + "\n", encoding="utf-8")
            os.replace(tmp, self._path)
        except OSError:
            tmp.unlink(missing_ok=True)
            return
        self._learnt = False


def _load(path: Path) -> dict[str, tuple[float | None, float]]:
    """The cache's entries; a missing or unreadable cache is an empty one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    entries: dict[str, tuple[float | None, float]] = {}
    for key, value in data.items():
        if (
            isinstance(value, list)
            and len(value) == 2
            and (value[0] is None or isinstance(value[0], (int, float)))
            and isinstance(value[1], (int, float))
        ):
            entries[key] = (None if value[0] is None else float(value[0]), float(value[1]))
    return entries
