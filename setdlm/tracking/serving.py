"""What ``setdlm ui`` checks before it announces a server: that it can serve it.

It printed its links and exited 0 when the port was taken (the links then led to another
server), when the host could not be resolved (the server died at once), and on a corrupted or
truncated store it moved the store aside and served an empty one. Each is refused here, before
anything is printed or started, naming the option or file: the store is never replaced (the
sync, which can rebuild it from the result files, is the one to do that).
"""

from __future__ import annotations

import errno
import socket

from setdlm.tracking.store import Store, StoreUnavailable, file_problem, sqlite_path


def refuse_unservable(host: str, port: int, store: Store) -> None:
    """Raise StoreUnavailable (an input error, exit status 2) naming what cannot be served."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise StoreUnavailable(
            f"--host {host}: cannot be resolved ({error.strerror or error}); expected an "
            "address of this machine, such as 127.0.0.1 or 0.0.0.0"
        ) from None
    family, kind, protocol, _, address = addresses[0]
    with socket.socket(family, kind, protocol) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind(address)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise StoreUnavailable(
                    f"--port {port}: already in use on {host} (another server, perhaps an "
                    "earlier `setdlm ui`); choose another --port, or open that one"
                ) from None
            raise StoreUnavailable(
                f"--host {host} --port {port}: cannot listen there ({error.strerror or error})"
            ) from None
    database = sqlite_path(store.uri)
    if database is None or not database.exists():
        return  # a server's store, or none yet (the UI creates an empty one: nothing replaced)
    problem = file_problem(database)
    if problem is not None and problem != "gone":
        raise StoreUnavailable(
            f"{database} is {problem}: not served, and left as it is; `setdlm sync RESULTS` "
            "rebuilds the store from the result files (keeping this one aside)"
        )
