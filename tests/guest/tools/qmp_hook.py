#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Test-bed QMP hook: runs beside one QEMU boot and sends QEMU the QMP commands the guest asks
for on its console, so a guest program can change an emulated device while it runs (for
example an NVMe controller's smart_critical_warning). A request is one console line
"# tb-qmp: {JSON command}" (a TAP comment: judges ignore it); each command and QEMU's answer
are logged to stdout. Usage: qmp_hook.py QMP-SOCKET CONSOLE-LOG (ends when killed, or when
QEMU closes the socket)."""
import json
import socket
import sys
import time

PREFIX = "# tb-qmp: "


def connect(path):
    for _ in range(1200):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return s
        except OSError:
            s.close()
            time.sleep(0.1)
    sys.exit("qmp_hook: no QMP socket at " + path)


def answer(f):
    """The next line of QMP that answers a command (events in between are logged)."""
    while True:
        line = f.readline()
        if not line:
            sys.exit("qmp_hook: QEMU closed the QMP socket")
        msg = json.loads(line)
        if "return" in msg or "error" in msg:
            return msg
        print("event", json.dumps(msg), flush=True)


def main():
    sock_path, console = sys.argv[1], sys.argv[2]
    f = connect(sock_path).makefile("rw")
    print("greeting", f.readline().strip(), flush=True)
    f.write(json.dumps({"execute": "qmp_capabilities"}) + "\n")
    f.flush()
    print("capabilities", json.dumps(answer(f)), flush=True)
    pos, rest = 0, ""
    while True:
        try:
            with open(console, "rb") as c:
                c.seek(pos)
                data = c.read()
        except FileNotFoundError:
            data = b""
        pos += len(data)
        rest += data.decode("utf-8", "replace")
        *lines, rest = rest.split("\n")
        for line in lines:
            line = line.strip("\r")
            i = line.find(PREFIX)
            if i < 0:
                continue
            try:
                cmd = json.loads(line[i + len(PREFIX):])
            except ValueError as e:
                print("bad request", repr(line), e, flush=True)
                continue
            f.write(json.dumps(cmd) + "\n")
            f.flush()
            print("sent", json.dumps(cmd), "->", json.dumps(answer(f)), flush=True)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
