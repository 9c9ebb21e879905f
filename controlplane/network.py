"""The network namespace `rayship-pods` the pod and service ranges are routed into, and the API server
forwarder (TCP, TLS passes through) the real node reaches the API server by."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from controlplane.config import (
    LINK_HOST_IP,
    LINK_NS_IP,
    NETNS,
    NODES,
    POD_CIDR,
    SERVICE_CIDR,
    VETH_HOST,
    VETH_NS,
)
from controlplane.processes import run_command


# --- network namespace ------------------------------------------------------------------------------
def netns_exists() -> bool:
    return NETNS in run_command(["ip", "netns", "list"], check=False).stdout.split()


def link_netns(netns: str, veth_host: str, veth_ns: str, host_ip: str, ns_ip: str) -> None:
    """The network namespace `netns` (made if missing), linked to the host by a veth pair: host_ip/30
    on the host's end, ns_ip/30 on its own; its loopback up. Each step is a no-op once done."""
    if netns not in run_command(["ip", "netns", "list"], check=False).stdout.split():
        run_command(["ip", "netns", "add", netns])
    ns = ["ip", "-n", netns]
    if run_command(["ip", "link", "show", veth_host], check=False).returncode != 0:
        run_command(["ip", "link", "add", veth_host, "type", "veth", "peer", "name", veth_ns, "netns", netns])
    run_command(["ip", "addr", "replace", f"{host_ip}/30", "dev", veth_host])
    run_command(["ip", "link", "set", veth_host, "up"])
    run_command([*ns, "addr", "replace", f"{ns_ip}/30", "dev", veth_ns])
    run_command([*ns, "link", "set", veth_ns, "up"])
    run_command([*ns, "link", "set", "lo", "up"])


def ensure_netns() -> None:
    """The pod network: POD_CIDR and SERVICE_CIDR lead into NETNS, where every connection is refused."""
    link_netns(NETNS, VETH_HOST, VETH_NS, LINK_HOST_IP, LINK_NS_IP)
    ns = ["ip", "-n", NETNS]
    for cidr in (POD_CIDR, SERVICE_CIDR):
        # In NETNS every address of the range is local, so its kernel answers a SYN with a RST. The
        # route lives in table `local`: only there does the kernel accept such an address as the
        # source of that RST. A more specific route added to the same table later wins over it.
        run_command([*ns, "route", "replace", "local", cidr, "dev", "lo", "table", "local"])
        run_command(
            ["ip", "route", "replace", cidr, "via", LINK_NS_IP, "dev", VETH_HOST, "src", LINK_HOST_IP]
        )
    probe = NODES[0].pod_cidr.split("/")[0].rsplit(".", 1)[0] + ".250"
    route = run_command(["ip", "route", "get", probe]).stdout
    if f"dev {VETH_HOST}" not in route:
        raise RuntimeError(f"pod address {probe} does not route into {NETNS}: {route}")


def is_mount_point(path: Path) -> bool:
    """From the kernel's mount table: os.path.ismount compares devices, and a folder bind-mounted onto
    itself (what `ip netns add` does) is on its parent's device."""
    return str(path) in (line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines())


# The local cluster and the kind cluster run at once in `make test`, each with a namespace in
# /run/netns: the first `up` made the folder's mount, the second found it, and the first `down` finds
# the second's namespace in it. What an `up` made is written here too, so that whichever `down` leaves
# the folder empty undoes it (a clean-clone CI run left `mount /run/netns` behind without it).
NETNS_MADE_MARK = Path("/run/rayship-netns-made")


def note_netns_dir(path: Path, *, mark: Path | None = None) -> tuple[bool, bool]:
    """Before `ip netns add`: (whether `path` is absent, whether it is not a mount point): what the
    namespace will make there; said in `mark` (NETNS_MADE_MARK) for every `down` when it is anything."""
    mark = mark or NETNS_MADE_MARK
    made_dir, made_mount = not path.exists(), not is_mount_point(path)
    if (made_dir or made_mount) and not mark.exists():
        mark.write_text(json.dumps({"dir": made_dir, "mount": made_mount}))
    return made_dir, made_mount


def release_netns_dir(path: Path, *, made_dir: bool, made_mount: bool, mark: Path | None = None) -> list[str]:
    """Undo what `ip netns add` made at `path` (its folder, the bind mount of it it keeps for good) for
    an `up` (this one's, or the other cluster's, as `mark` says), once no network namespace is left in
    it. Returns what could not be undone, with the reason. A machine whose folder was there but not
    mounted got the mount from `up`: it goes too (a CI run saw `mount /run/netns` left behind so)."""
    if not path.is_dir() or any(path.iterdir()):
        return []
    mark = mark or NETNS_MADE_MARK
    if mark.exists():
        noted = json.loads(mark.read_text())
        made_dir, made_mount = made_dir or bool(noted.get("dir")), made_mount or bool(noted.get("mount"))
    problems = []
    while made_mount and is_mount_point(path):  # stacked mounts, one per umount
        done = run_command(["umount", str(path)], check=False)
        if done.returncode != 0:
            problems.append(f"umount {path}: {done.stderr.strip()}")
            break
    if made_dir and not problems:
        try:
            path.rmdir()
        except OSError as err:
            problems.append(f"rmdir {path}: {err}")
    if not problems:
        mark.unlink(missing_ok=True)
    return problems


def remove_netns() -> bool:
    """Remove NETNS (its veth pair and the host routes through it go with it). True if it existed."""
    for cidr in (POD_CIDR, SERVICE_CIDR):
        run_command(["ip", "route", "del", cidr, "dev", VETH_HOST], check=False)
    run_command(["ip", "link", "del", VETH_HOST], check=False)
    if not netns_exists():
        return False
    run_command(["ip", "netns", "del", NETNS])
    return True


# --- the API server forwarder (runs as its own component) -------------------------------------------
def api_forward(listen: str, port: int, to_port: int, to_host: str = "127.0.0.1") -> None:
    """TCP passthrough listen:port -> to_host:to_port (TLS is end to end: the API server's own)."""
    import asyncio

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError) as err:
            print(f"api-forward: connection ended: {err}", flush=True)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(to_host, to_port)
        except OSError as err:
            print(f"api-forward: the API server refused: {err}", flush=True)
            writer.close()
            return
        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                w.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, listen, port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        print(f"api-forward: {listen}:{port} -> {to_host}:{to_port}", flush=True)
        async with server:
            await stop.wait()

    asyncio.run(main())
