#!/usr/bin/env python3
"""Hold a listening socket and hand it to processes as systemd's socket activation does.

systemd keeps a `.socket` unit's socket open across restarts of its service and starts each new
process with the socket as file descriptor 3, `LISTEN_FDS=1`, `LISTEN_PID` set to the new
process's id and `LISTEN_FDNAMES` to the socket's name. This does the same for tests, driven by
lines on stdin, answering each on stdout:

    start <name> <stderr file> <argv...>  -> "pid <pid>"   (fd 3 = the socket, LISTEN_* set)
    term <pid>                            -> "termed <pid>"
    wait <pid>                            -> "exited <pid> <exit code>"

Usage: socket_holder.py <host> <fd name>; prints "listening <host>:<port>" first.
"""
import os
import signal
import socket
import sys


def start(sock, name, err_path, argv):
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(sock.fileno(), 3)
            os.set_inheritable(3, True)
            env = dict(os.environ)
            env["LISTEN_FDS"] = "1"
            env["LISTEN_PID"] = str(os.getpid())
            env["LISTEN_FDNAMES"] = name
            err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(err, 2)
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)
            os.dup2(devnull, 1)
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    return pid


def main():
    host, name = sys.argv[1], sys.argv[2]
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(2048)
    print("listening %s:%d" % sock.getsockname(), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "start":
            pid = start(sock, words[1], words[2], words[3:])
            print("pid %d" % pid, flush=True)
        elif words[0] == "term":
            os.kill(int(words[1]), signal.SIGTERM)
            print("termed %s" % words[1], flush=True)
        elif words[0] == "wait":
            _, status = os.waitpid(int(words[1]), 0)
            print("exited %s %d" % (words[1], os.waitstatus_to_exitcode(status)), flush=True)
    sock.close()


if __name__ == "__main__":
    main()
