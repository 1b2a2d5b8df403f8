"""Network and environment facts of one host, and TCP reachability between hosts.

Runs on the host (stdlib only; `facts --versions` imports torch in this process, unless
its version.py says a CPU build):

    facts [--versions] [--disk PATH]    one JSON object: names, IPv4 interfaces, clock...
    listen PORT[,PORT...] EXPECT TIMEOUT NONCE
                                        bind the first free port on 0.0.0.0, print
                                        `LISTEN port`, answer probes with NONCE, print
                                        `PEER label addr` per probe; end after EXPECT
                                        probes or TIMEOUT seconds
    connect NONCE LABEL TIMEOUT HOST:PORT...
                                        probe each target at once; one JSON list of results
                                        (ok, error, ms, and this host's source address and
                                        interface on the route to it)
    sshd TIMEOUT HOST:PORT...           the same, each target's answer an SSH server's
                                        banner (`SSH-...`): can this host reach the others'
                                        sshd (a push's host-to-host hops)

A probe counts only when the listener answers with the nonce, so a port that happens to be
open elsewhere (the worker's own docker0 address, say) is never mistaken for the master.
"""

import importlib.util
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time


def _addrs_ip():
    out = subprocess.run(
        ["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, timeout=10
    )
    if out.returncode != 0:
        raise OSError(out.stderr.strip())
    found = []
    for link in json.loads(out.stdout or "[]"):
        up = "UP" in link.get("flags", []) or link.get("operstate") == "UP"
        for info in link.get("addr_info", []):
            if info.get("family") == "inet":
                found.append(
                    {
                        "ifname": link.get("ifname", ""),
                        "addr": info.get("local", ""),
                        "prefixlen": int(info.get("prefixlen", 32)),
                        "up": up,
                    }
                )
    return found


def _addrs_ioctl():
    """Without iproute2: the primary IPv4 address and netmask of each interface."""
    import fcntl

    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            req = struct.pack("256s", name.encode()[:15])
            try:
                addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])
                mask = fcntl.ioctl(s.fileno(), 0x891B, req)[20:24]
            except OSError:
                continue
            bits = bin(int.from_bytes(mask, "big")).count("1")
            found.append({"ifname": name, "addr": addr, "prefixlen": bits, "up": True})
    return found


def addrs():
    try:
        return _addrs_ip()
    except (OSError, ValueError, subprocess.SubprocessError):
        return _addrs_ioctl()


def route_to(host, table):
    """This host's source address and interface on the route to `host` (no packet sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            src = s.getsockname()[0]
    except OSError:
        return "", ""
    for item in table:
        if item["addr"] == src:
            return src, item["ifname"]
    return src, ""


def versions():
    info: dict = {
        "torch": None,
        "torch_error": None,
        "cuda": None,
        "nccl": None,
        "gpus": 0,
        "gpu_names": [],
    }
    # numpy, found without importing it: torch.distributed.checkpoint needs it over several ranks
    info["numpy"] = importlib.util.find_spec("numpy") is not None
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its siblings on the host
    from run_provenance import cpu_build  # type: ignore[import-not-found]

    info["torch"] = cpu_build()  # a CPU build's version, read without importing torch
    if info["torch"] is not None:
        return info
    try:
        import torch
    except Exception as exc:  # not installed, or broken
        info["torch_error"] = f"{type(exc).__name__}: {exc}"
        return info
    info["torch"] = str(getattr(torch, "__version__", "unknown"))
    info["cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
    try:
        if torch.cuda.is_available():
            info["gpus"] = torch.cuda.device_count()
            info["gpu_names"] = [torch.cuda.get_device_name(i) for i in range(info["gpus"])]
            nccl = torch.cuda.nccl.version()
            info["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except Exception as exc:
        info["torch_error"] = f"CUDA: {type(exc).__name__}: {exc}"
    return info


def facts(args):
    data = {
        "hostname": socket.gethostname(),
        "fqdn": socket.getfqdn(),
        "addrs": addrs(),
        "python": ".".join(map(str, sys.version_info[:3])),
        "executable": sys.executable,
        "time": time.time(),
    }
    if "--disk" in args:
        path = os.path.expanduser(args[args.index("--disk") + 1])
        while path and not os.path.exists(path):
            path = os.path.dirname(path)
        st = os.statvfs(path or "/")
        data["disk_free"] = st.f_bavail * st.f_frsize
    if "--versions" in args:
        data.update(versions())
    data["time"] = time.time()  # after the imports: the clock check compares this
    print(json.dumps(data))


def listen(ports, expect, timeout, nonce):
    server = None
    for port in ports:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            s.listen(64)
            server = s
            break
        except OSError:
            s.close()
    if server is None:
        print("BUSY", flush=True)
        return 3
    print(f"LISTEN {port}", flush=True)
    deadline = time.monotonic() + timeout
    seen = 0
    while seen < expect:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        server.settimeout(left)
        try:
            conn, peer = server.accept()
        except OSError:
            break
        with conn:
            conn.settimeout(5)
            try:
                hello = conn.makefile("rb").readline(256).decode(errors="replace").split()
                conn.sendall(f"{nonce}\n".encode())
            except OSError:
                continue
        if len(hello) == 2 and hello[0] == "vmrun-probe":
            seen += 1
            print(f"PEER {hello[1]} {peer[0]}", flush=True)
    server.close()
    print("DONE", flush=True)
    return 0


SSHD = "SSH-"  # an SSH server's banner starts so (RFC 4253): the `sshd` mode's answer


def _probe(target, nonce, label, timeout, table, results, index):
    host, _, port = target.rpartition(":")
    src, ifname = route_to(host, table)
    began = time.monotonic()
    result = {"target": target, "ok": False, "error": "", "ms": 0.0, "src": src, "ifname": ifname}
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as s:
            s.settimeout(timeout)
            if nonce != SSHD:
                s.sendall(f"vmrun-probe {label}\n".encode())
            answer = s.makefile("rb").readline(256).decode(errors="replace").strip()
        if answer == nonce or (nonce == SSHD and answer.startswith(SSHD)):
            result["ok"] = True
        else:
            result["error"] = "another program answered on that port"
    except socket.timeout:  # noqa: UP041 (an alias only from Python 3.10; hosts may be older)
        result["error"] = "timed out (a firewall dropping packets, or no route)"
    except OSError as exc:
        result["error"] = exc.strerror or str(exc)
    result["ms"] = round((time.monotonic() - began) * 1000, 1)
    results[index] = result


def connect(nonce, label, timeout, targets):
    table = addrs()
    results = [None] * len(targets)
    threads = [
        threading.Thread(target=_probe, args=(t, nonce, label, timeout, table, results, i))
        for i, t in enumerate(targets)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(results))


def main(argv):
    mode, args = argv[0], argv[1:]
    if mode == "facts":
        facts(args)
        return 0
    if mode == "listen":
        ports = [int(p) for p in args[0].split(",")]
        return listen(ports, int(args[1]), float(args[2]), args[3])
    if mode == "connect":
        connect(args[0], args[1], float(args[2]), args[3:])
        return 0
    if mode == "sshd":
        connect(SSHD, "", float(args[0]), args[1:])
        return 0
    print(f"netprobe: unknown mode {mode}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
