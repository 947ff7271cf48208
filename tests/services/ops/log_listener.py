"""A supervisord event listener written with supervisor's own ``childutils`` (run by the peer
virtualenv's python, tests/services/ops/peers.py): every event it gets is appended to the file
named by argv[1] as one JSON line ``{"eventname", "headers", "data"}`` (the payload parsed by
``childutils.eventdata``: its header line as a dict, then the data), then acknowledged."""

import json
import sys

from supervisor import childutils


def main() -> None:
    with open(sys.argv[1], "a", encoding="utf-8") as out:
        while True:
            headers, payload = childutils.listener.wait(sys.stdin, sys.stdout)
            pheaders, data = childutils.eventdata(payload)
            out.write(json.dumps({"eventname": headers["eventname"], "headers": pheaders,
                                  "data": data}) + "\n")
            out.flush()
            childutils.listener.ok(sys.stdout)


if __name__ == "__main__":
    main()
