"""Address forms the egress policy must judge (webhooks and a job's URLs alike), and a resolver tests control."""

import ipaddress

NOT_PUBLIC = [
    "127.0.0.1",
    "127.8.9.10",
    "10.1.2.3",
    "172.16.5.4",
    "192.168.1.1",
    "169.254.169.254",
    "100.64.0.1",
    "0.0.0.0",
    "224.0.0.1",
    "240.0.0.1",
    "255.255.255.255",
    "::1",
    "::",
    "fe80::1",
    "fc00::1",
    "fd12:3456::1",
    "ff02::1",
    "::ffff:127.0.0.1",
    "::ffff:169.254.169.254",
    "::ffff:10.0.0.1",
    "64:ff9b::a9fe:a9fe",
    "2002:7f00:1::1",
    "0:0:0:0:0:0:0:1",
    "0:0:0:0:0:ffff:7f00:1",
    "0:0:0:0:0:ffff:a9fe:a9fe",
]
PUBLIC = ["93.184.216.34", "8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"]


def in_url(address: str) -> str:
    """The address as the host of a URL (IPv6 in brackets)."""
    return f"[{address}]" if ":" in address else address


def resolver(table: dict[str, list[str]]):
    """Names resolve as the table says (a list of answers is given in turn when its items are lists); IP literals
    resolve to themselves; anything else does not resolve."""
    calls: dict[str, int] = {}

    async def resolve(host: str, port: int) -> list[str]:
        if host in table:
            answers = table[host]
            if answers and isinstance(answers[0], list):  # one answer per lookup: DNS rebinding
                calls[host] = calls.get(host, 0) + 1
                return answers[min(calls[host], len(answers)) - 1]
            return answers
        try:
            return [str(ipaddress.ip_address(host))]  # an IP literal resolves to itself
        except ValueError:
            raise OSError(f"{host}: name or service not known") from None

    return resolve
