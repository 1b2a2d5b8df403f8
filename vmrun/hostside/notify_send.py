"""A run's notification, from the host (stdlib only): what happened to the run, told to the
webhooks of the run's 0600 notify.json, once.

    python3 notify_send.py REC send [EVENT [EXIT [NAME=VALUE...]]]  # the run's shell, at its end
    python3 notify_send.py REC render [EVENT]  # vmrun on the laptop, at the end it saw
    python3 notify_send.py - post               # vmrun on the laptop, without Apprise

REC is the run's record folder; its notify.json (from the launch spec, by run_agent.py, never on
a command line) holds the webhooks, the message's templates, the events wanted and the facts
vmrun knew at the start (vmrun.notify.send.Charge: the prices, the earlier attempts' time, the
outputs' folder): the sender reads that file and the record's own few files, never run.json.
EVENT defaults to what the record says: `end` (exit code 0), `fail`
(another code), `stopped` (vmrun stop). Each event is claimed by making REC/notified.EVENT:
whoever makes it first (this sender, or vmrun following the run) sends, so an event is told
once. `send` posts to each webhook (3 tries, 5 s each, then one line on stderr: the run's log);
`render` claims for the laptop and prints {"event", "title", "body", "send": all|local|none}
(`local`: the host sent its webhooks; the laptop sends only what the host cannot, such as mail).
`post` reads {"hooks", "title", "body", "event"} on stdin and prints, per hook, a JSON line
[shown, null or why not]: the laptop's webhooks where it has no Apprise.
Exit 0, whatever a webhook answered: a notification never fails a run.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request

TRIES = 3
TIMEOUT_S = 5.0
PAUSE_S = float(os.environ.get("VMRUN_NOTIFY_PAUSE_S") or 1.0)  # 1 s, then 2 s between tries


class Facts(dict):
    def __missing__(self, key):
        return "?"


def read(path, default=""):
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return default


def last_metrics(out_dir):
    text = read(os.path.join(out_dir, "metrics.jsonl")) if out_dir else ""
    for line in reversed(text.splitlines()):
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            return item
    return {}


def clock(seconds):
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def first_start(rec):
    """The run's first start (hosts: first_started; a Slurm job: its `starts` lines)."""
    started = read(os.path.join(rec, "first_started"))
    if not started:
        first = read(os.path.join(rec, "starts")).split("\n")[0].split()
        started = first[1] if len(first) > 1 else ""
    return int(started) if started.isdigit() else None


def ran_so_far(rec, config):
    """The run's time so far, what it is charged: a hosts run's earlier attempts
    (notify.json's ran_before_s) and this one (since its pid file); a Slurm job's since its
    first start."""
    try:
        began = os.stat(os.path.join(rec, "pid")).st_mtime
    except OSError:
        started = first_start(rec)
        return None if started is None else time.time() - started
    before = config.get("ran_before_s")
    if not isinstance(before, (int, float)) or isinstance(before, bool):
        before = 0
    return before + time.time() - began


def out_dir_of(rec, config):
    return read(os.path.join(rec, "out_dir")) or str(config.get("out_dir") or "")


def cost_text(config, seconds):
    """ ", cost $1.23" (or "12.30 DKK"): the run's time at the prices vmrun knew as it
    started (notify.json's; vmrun.results.cost); "" where they are unknown."""
    per_hour = config.get("price_per_hour")
    if not isinstance(per_hour, (int, float)) or isinstance(per_hour, bool):
        return ""
    amount = round(seconds / 3600 * per_hour, 2)
    currency = str(config.get("currency") or "USD")
    return f", cost ${amount:,.2f}" if currency == "USD" else f", cost {amount:,.2f} {currency}"


def facts_of(rec, config, event, exit_given=""):
    """What the message says: vmrun's facts from the start, and the record's now."""
    facts = Facts(config.get("facts") or {})
    code = exit_given or read(os.path.join(rec, "exit_code"))
    stopped = os.path.exists(os.path.join(rec, "stopped"))
    if not event:
        event = "stopped" if stopped else ("end" if code == "0" else "fail")
    state = {"end": "done", "fail": "failed", "requeue": "requeued"}.get(event, event)
    facts.update(event=event, state=state, exit=code or "-")
    ran = ran_so_far(rec, config)
    facts["cost"] = ""
    if ran is not None:
        facts["duration"] = clock(ran)
        facts["cost"] = cost_text(config, ran)
    metrics = last_metrics(out_dir_of(rec, config))
    epoch = metrics.get("epoch")
    asked = facts.get("epochs_asked")
    if epoch is not None:
        facts["epochs"] = f"{epoch}/{asked}" if asked else str(epoch)
    loss = metrics.get("loss", metrics.get("train_loss"))
    if isinstance(loss, (int, float)):
        facts["loss"] = f"{loss:.4g}"
    return facts


def first_failure(rec):
    """torchrun's first failed worker in words (`said`, as run_failure.py kept it in the
    record's failure.json); "" when there is none."""
    try:
        with open(os.path.join(rec, "failure.json"), encoding="utf-8") as fh:
            return str(json.load(fh).get("said") or "")
    except (OSError, ValueError, AttributeError):
        return ""


def compose(rec, config, facts, event):
    """The message's title and body: the templates filled, and a failure's first worker."""
    title = config.get("title", "vmrun: run {run} {state}").format_map(facts)
    text = config.get("body", "run {run} {state}").format_map(facts)
    failed_first = first_failure(rec) if event == "fail" else ""
    if failed_first:
        text += f"\nfirst to fail: {failed_first}"
    return title, text


def claim(rec, name):
    try:
        os.mkdir(os.path.join(rec, f"notified.{name}"))
        return True
    except FileExistsError:
        return False
    except OSError:
        return True  # a record folder that cannot be written: send rather than stay silent


def body_of(kind, title, text, event):
    if kind == "ntfy":
        tags = "x" if event == "fail" else "white_check_mark"
        return text.encode(), {"Title": title, "Tags": tags}
    if kind == "slack":
        return json.dumps({"text": f"*{title}*\n{text}"}).encode(), {}
    if kind == "discord":
        return json.dumps({"content": f"**{title}**\n{text}"}).encode(), {}
    # Apprise's own JSON form, so a receiver reads the host's and the laptop's alike
    kind_of = {"end": "success", "fail": "failure", "stopped": "warning"}.get(event, "info")
    payload = {
        "version": "1.0",
        "title": title,
        "message": text,
        "attachments": [],
        "type": kind_of,
    }
    return json.dumps(payload).encode(), {"Content-Type": "application/json"}


def post(hook, title, text, event):
    """One webhook, a few tries; None when it took it, else why not."""
    data, headers = body_of(hook.get("kind", "json"), title, text, event)
    if hook.get("auth"):
        headers["Authorization"] = hook["auth"]
    headers.setdefault("Content-Type", "text/plain; charset=utf-8")
    why = ""
    for attempt in range(TRIES):
        if attempt:
            time.sleep(PAUSE_S * attempt)  # a receiver restarting gets a moment
        request = urllib.request.Request(hook["url"], data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
                if 200 <= answer.status < 300:
                    return None
                why = f"HTTP {answer.status}"
        except urllib.error.HTTPError as exc:
            why = f"HTTP {exc.code}"
            if 400 <= exc.code < 500 and exc.code != 429:
                break  # a refusal: asking again will not change it
        except (urllib.error.URLError, OSError) as exc:
            why = str(getattr(exc, "reason", exc))
    return why


def post_all(job):
    for hook in job["hooks"]:
        why = post(hook, job["title"], job["body"], job["event"])
        print(json.dumps([hook.get("shown", "a webhook"), why]), flush=True)


def main():
    rec, mode = sys.argv[1], sys.argv[2]
    if mode == "post":
        post_all(json.load(sys.stdin))
        return 0
    event = sys.argv[3] if len(sys.argv) > 3 else ""
    exit_given = sys.argv[4] if len(sys.argv) > 4 else ""
    try:
        with open(os.path.join(rec, "notify.json"), encoding="utf-8") as fh:
            config = json.load(fh)
    except (OSError, ValueError):
        config = None
    if config is None:
        if mode == "render":
            print(json.dumps({"send": "none"}))
        return 0
    facts = facts_of(rec, config, event, exit_given)
    event = facts["event"]
    for word in sys.argv[5:]:  # more facts, NAME=VALUE (autostop: off=, since=)
        name, _, value = word.partition("=")
        facts[name] = value
    title, text = compose(rec, config, facts, event)
    if event not in config.get("on", []):
        if mode == "render":
            print(json.dumps({"send": "none", "event": event}))
        return 0
    if mode == "render":
        send = "all" if claim(rec, event) else ("local" if claim(rec, event + ".local") else "none")
        print(json.dumps({"event": event, "title": title, "body": text, "send": send}))
        return 0
    if not claim(rec, event):
        return 0  # vmrun, following the run, told it already
    for hook in config.get("webhooks", []):
        why = post(hook, title, text, event)
        if why is not None:
            shown = hook.get("shown", "a webhook")
            print(
                f"vmrun: the {event} notification to {shown} was not sent: {why}", file=sys.stderr
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
