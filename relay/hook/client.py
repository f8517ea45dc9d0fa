"""One bounded HTTP/1.1 request, written on a raw socket.

`http.client` costs about 20 ms of imports and `socket.py` about 6 ms (enum,
selectors); the hook needs one request with `Connection: close`, so it talks
through the C `_socket` module directly. `ssl` (and with it `socket`) is
imported only for https URLs. Every step is bounded by one absolute deadline
(`until`, on the time.monotonic() clock): name resolution runs in a helper
thread we stop waiting for, and every connect/send/recv gets the time left.
Foreign errors become a `HookFailure` carrying the outcome, here and only here.
"""

from __future__ import annotations

import _socket
import _thread
import time

from relay.numerals import is_integer

TYPE_CHECKING = False  # `import typing` would cost the hook a few milliseconds
if TYPE_CHECKING:
    from typing import Any

MAX_HEADER_BYTES = 16 * 1024
USER_AGENT = "relay-hook/0.1"


class HookFailure(Exception):
    """Retrieval failed; `outcome` is the outcome-log label, `detail` a short reason."""

    def __init__(self, outcome: str, detail: str) -> None:
        super().__init__(f"{outcome}: {detail}")
        self.outcome = outcome
        self.detail = detail


def parse_url(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, base path) of an http(s) URL; ValueError when it is not one."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("http", "https"):
        raise ValueError("URL must start with http:// or https://")
    netloc, slash, path = rest.partition("/")
    if "@" in netloc or "?" in rest or "#" in rest or not netloc:
        raise ValueError("URL must be scheme://host[:port][/path] without credentials or query")
    port_text = ""
    if netloc.startswith("["):
        host, bracket, tail = netloc[1:].partition("]")
        if not bracket or (tail and not tail.startswith(":")):
            raise ValueError("bad IPv6 literal")
        port_text = tail[1:]
    else:
        host, _, port_text = netloc.partition(":")
    if port_text and not is_integer(port_text):  # int() took `:80_80`, which urllib refuses
        raise ValueError("bad host or port")
    port = int(port_text) if port_text else (443 if scheme == "https" else 80)
    if not host or not 0 < port < 65536:
        raise ValueError("bad host or port")
    return scheme, host, port, ("/" + path).rstrip("/") if slash else ""


def _left(until: float, step: str) -> float:
    left = until - time.monotonic()
    if left <= 0:
        raise HookFailure("timeout", step)
    return left


def resolve(host: str, port: int, until: float) -> list[tuple[int, tuple]]:
    """Addresses to try: IP literals and localhost skip DNS; names resolve in a helper thread."""
    for family in (_socket.AF_INET, _socket.AF_INET6):
        try:
            _socket.inet_pton(family, host)
            return [(family, (host, port))]
        except (OSError, ValueError):
            pass
    if host.lower() in ("localhost", "localhost."):
        return [(_socket.AF_INET, ("127.0.0.1", port)), (_socket.AF_INET6, ("::1", port))]
    done = _thread.allocate_lock()
    done.acquire()
    box: list = []

    def work() -> None:
        try:
            box.append(_socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM))
        except BaseException as exc:  # reported to the waiting thread below
            box.append(exc)
        finally:
            done.release()

    _thread.start_new_thread(work, ())
    if not done.acquire(timeout=_left(until, "dns")):
        raise HookFailure("timeout", "dns")
    result = box[0]
    if isinstance(result, BaseException):
        raise HookFailure("unavailable", f"dns: {result}")
    return [(family, addr) for family, _, _, _, addr in result if family in (2, 10)]


def _connect(scheme: str, host: str, addrs: list, until: float):
    last: BaseException | None = None
    for family, addr in addrs:
        sock: Any  # socket.socket for TLS, the lighter _socket.socket otherwise
        if scheme == "https":
            import socket  # ssl wraps socket.socket objects

            sock = socket.socket(family, socket.SOCK_STREAM)
        else:
            sock = _socket.socket(family, _socket.SOCK_STREAM)
        try:
            sock.settimeout(_left(until, "connect"))
            sock.connect(addr)
            if scheme == "https":
                import ssl

                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
            return sock
        except TimeoutError:
            sock.close()
            raise
        except OSError as exc:
            sock.close()
            last = exc
    raise HookFailure("unavailable", f"connect: {last}")


def _recv(sock, until: float, step: str) -> bytes:
    sock.settimeout(_left(until, step))
    return sock.recv(65536)


def _read_exact(sock, buf: bytearray, n: int, until: float) -> None:
    while len(buf) < n:
        chunk = _recv(sock, until, "body")
        if not chunk:
            raise HookFailure("unavailable", "connection closed mid-body")
        buf += chunk


def _dechunk(sock, buf: bytearray, until: float, max_bytes: int) -> bytes:
    """Decode a chunked body, refusing it as soon as its declared sizes exceed max_bytes."""
    out = bytearray()
    while True:
        while (eol := buf.find(b"\r\n")) < 0:
            if len(buf) > 1024:
                raise HookFailure("invalid_response", "bad chunk header")
            _read_exact(sock, buf, len(buf) + 1, until)
        try:
            size = int(bytes(buf[:eol]).split(b";")[0].strip(), 16)
        except ValueError:
            raise HookFailure("invalid_response", "bad chunk size") from None
        del buf[: eol + 2]
        if size == 0:
            return bytes(out)
        if size < 0 or len(out) + size > max_bytes:
            raise HookFailure("invalid_response", "response too large")
        _read_exact(sock, buf, size + 2, until)
        out += buf[:size]
        del buf[: size + 2]


def _read_response(
    sock, until: float, max_bytes: int, timings: dict, t0: float
) -> tuple[int, bytes]:
    buf = bytearray()
    while (end := buf.find(b"\r\n\r\n")) < 0:
        if len(buf) > MAX_HEADER_BYTES:
            raise HookFailure("invalid_response", "headers too large")
        chunk = _recv(sock, until, "response")
        if not chunk:
            raise HookFailure("unavailable", "connection closed before the response")
        buf += chunk
    timings["wait"] = _ms(time.monotonic() - t0)
    t1 = time.monotonic()
    lines = bytes(buf[:end]).split(b"\r\n")
    del buf[: end + 4]
    parts = lines[0].split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise HookFailure("invalid_response", "not an HTTP/1.x response")
    status = int(parts[1])
    if status != 200:
        return status, b""  # the status says everything the hook acts on
    headers = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    if b"transfer-encoding" in headers:
        if headers[b"transfer-encoding"].lower() != b"chunked":
            raise HookFailure("invalid_response", "unsupported transfer encoding")
        body = _dechunk(sock, buf, until, max_bytes)
    elif b"content-length" in headers:
        try:
            length = int(headers[b"content-length"])
        except ValueError:
            raise HookFailure("invalid_response", "bad content-length") from None
        if not 0 <= length <= max_bytes:
            raise HookFailure("invalid_response", "response too large")
        _read_exact(sock, buf, length, until)
        body = bytes(buf[:length])
    else:  # body runs to the end of the connection
        while chunk := _recv(sock, until, "body"):
            buf += chunk
            if len(buf) > max_bytes:
                raise HookFailure("invalid_response", "response too large")
        body = bytes(buf)
    timings["body"] = _ms(time.monotonic() - t1)
    return status, body


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def request(
    method: str,
    url: str,
    path: str,
    key: str,
    body: bytes | None,
    until: float,
    max_bytes: int,
    timings: dict,
) -> tuple[int, bytes]:
    """Send one request and return (status, body of a 200 response), or raise HookFailure."""
    try:
        scheme, host, port, base = parse_url(url)
    except ValueError as exc:
        raise HookFailure("unavailable", f"bad url: {exc}") from None
    sock = None
    try:
        t = time.monotonic()
        addrs = resolve(host, port, until)
        timings["dns"] = _ms(time.monotonic() - t)
        t = time.monotonic()
        sock = _connect(scheme, host, addrs, until)
        timings["connect"] = _ms(time.monotonic() - t)
        host_header = f"[{host}]" if ":" in host else host
        if port != (443 if scheme == "https" else 80):
            host_header += f":{port}"
        head = (
            f"{method} {base}{path} HTTP/1.1\r\nHost: {host_header}\r\n"
            f"Authorization: Bearer {key}\r\nUser-Agent: {USER_AGENT}\r\n"
            "Accept: application/json\r\nConnection: close\r\n"
        )
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        t = time.monotonic()
        sock.settimeout(_left(until, "send"))
        sock.sendall(head.encode("latin-1") + b"\r\n" + (body or b""))
        return _read_response(sock, until, max_bytes, timings, t)
    except HookFailure:
        raise
    except TimeoutError:
        raise HookFailure("timeout", "network") from None
    except (OSError, UnicodeError) as exc:
        raise HookFailure("unavailable", f"{type(exc).__name__}: {exc}") from None
    finally:
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass
