"""The worker command line LocalRunner gives Beam: hands this process's environment to the fork
server (see workers.py) and exits with the forked worker's status.

Run as `python -S _attach.py SOCKET`: standard library only, no site-packages, so it starts in
~20 ms.
"""

import json
import os
import socket
import struct
import sys


def main() -> int:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(sys.argv[1])
    body = json.dumps(dict(os.environ)).encode()
    conn.sendall(struct.pack(">I", len(body)) + body)
    status = conn.recv(1)  # blocks while the worker runs
    if not status:
        sys.stderr.write("recordforge: the forked Beam worker ended without a status\n")
        return 1
    return status[0]


if __name__ == "__main__":
    sys.exit(main())
