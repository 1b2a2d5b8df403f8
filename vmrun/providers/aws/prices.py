"""What an instance costs per hour, in USD: on-demand from the AWS Price List API, spot
from the zone's latest spot price.

A price is a courtesy of `vmrun cloud`, never a reason for it to fail: any failure (no
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
HOURS_PER_MONTH = 730.0
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


def volume_filters(volume_type: str, region: str) -> list[dict[str, str]]:
    wanted = {"productFamily": "Storage", "volumeApiName": volume_type, "regionCode": region}
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in wanted.items()]


def parse_on_demand(price_list: list[Any], unit: str = "hrs") -> float | None:
    """The USD price per `unit` (hours; "gb-mo" for disks) in a `get_products` PriceList
    (JSON strings, one per product): the first nonzero OnDemand one; None when none."""
    for item in price_list:
        product = json.loads(item) if isinstance(item, str) else item
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            for dim in term.get("priceDimensions", {}).values():
                usd = dim.get("pricePerUnit", {}).get("USD")
                if usd is not None and str(dim.get("unit", "")).lower() in (unit, unit[:-1]):
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


def query_volume(pricing: Any, volume_type: str, region: str) -> float | None:
    """USD per GB-month of a volume type's storage (IOPS and throughput above the
    included ones are priced apart, and not counted)."""
    answer = pricing.get_products(
        ServiceCode="AmazonEC2",
        Filters=volume_filters(volume_type, region),
        FormatVersion="aws_v1",
        MaxResults=10,
    )
    return parse_on_demand(answer.get("PriceList", []), unit="gb-mo")


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


class _Refused(Exception):
    """The Price List API refused an earlier question of this listing: not asked again."""


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

        def ask() -> float | None:
            return query_on_demand(self._pricing(), instance_type, region)

        return self._price(key, ON_DEMAND_TTL, ask)

    def spot(self, instance_type: str, zone: str, region: str) -> float | None:
        if not zone:
            return None
        key = f"spot/{zone}/{instance_type}"

        def ask() -> float | None:
            return query_spot(self._session.client("ec2", region, quick=True), instance_type, zone)

        return self._price(key, SPOT_TTL, ask)

    def volume(self, volume_type: str, size_gb: int, region: str) -> float | None:
        """A volume's USD per hour: its GB-month price times its size, over a month's
        hours (AWS's own 730)."""
        key = f"volume/{region}/{volume_type}"

        def ask() -> float | None:
            return query_volume(self._pricing(), volume_type, region)

        per_gb_month = self._price(key, ON_DEMAND_TTL, ask)
        return None if per_gb_month is None else per_gb_month * size_gb / HOURS_PER_MONTH

    def _pricing(self) -> Any:
        if self._pricing_refused:
            raise _Refused
        return self._session.client("pricing", PRICING_REGION, quick=True)

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
        except Exception:  # a price is never worth a failure: shown as unknown
            if not key.startswith("spot/"):
                self._pricing_refused = True  # no permission, no answer: the same for the rest
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
