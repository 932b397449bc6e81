"""The python tool's runner: the first code the sandboxed interpreter runs, before the model's.

Started as ``python -I [-S] -B -c <this file's text> DROP_TO CODE_PATH LIMITS AUDIT`` (its text, not
its path: the sandbox does not mount the package):

* DROP_TO: a uid to drop to first (bwrap as root keeps CAP_SETUID/CAP_SETGID for this only), or "";
* CODE_PATH: the file with the model's code, or "-" to wait on stdin for it (a sandbox started ahead);
* LIMITS: ``RLIMIT_NAME=soft:hard,...``, set here, inside the sandbox's namespaces and once the uid is
  dropped, before the code is read;
* AUDIT: "" (no hook), or the code's home and the readable roots, newline-separated, for the audit
  hook (defence in depth in the unsafe modes).

Then it runs the code REPL-style: the value of a final expression is shown (repr), an uncaught
exception is its traceback's last line. It imports only what it must (``_ast``, not ``ast``; no
``json``, ``re`` or ``traceback`` before an error): every import is paid by every call.
"""

import sys


def _prepare():
    import _signal
    import os
    import resource
    drop_to, code_path, limits, audit = sys.argv[1:5]
    # The CPU limit's SIGXCPU, as an exit code the parent recognises. A handler rather than the
    # default action because a pid namespace's init (the code, under unshare) ignores default-action
    # signals; the hard limit's SIGKILL a second later is the enforcement either way.
    _signal.signal(_signal.SIGXCPU, lambda *_: os._exit(128 + _signal.SIGXCPU))
    if drop_to:  # bwrap as root kept CAP_SETUID/CAP_SETGID for this only
        os.setgroups([])
        os.setgid(int(drop_to))
        os.setuid(int(drop_to))
    for item in limits.split(","):  # set here: inside the user namespace, and once the uid is dropped
        name, soft, hard = item.replace("=", ":").split(":")
        resource.setrlimit(getattr(resource, name), (int(soft), int(hard)))
    if code_path == "-":  # a pre-started sandbox: it waits here, limits set, until the parent sends the code
        source = sys.stdin.buffer.read().decode("utf-8", "replace")  # EOF (the parent gone): nothing to run
    else:
        with open(code_path, encoding="utf-8", errors="replace") as f:
            source = f.read()
    sys.argv = [""]
    if audit:
        _install_hook(*audit.split("\n", 1))
    return source


def _install_hook(home, readable):
    import os
    readable = readable.split("\n")
    deny = {"os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty", "subprocess.Popen",
            "os.kill", "os.killpg", "signal.pthread_kill", "socket.__new__", "socket.connect", "socket.bind",
            "socket.sendto", "socket.sendmsg", "socket.getaddrinfo", "ctypes.dlopen", "ctypes.dlsym",
            "ctypes.cdata", "ctypes.call_function", "sys.remote_exec"}
    writes = {"os.remove", "os.rmdir", "os.mkdir", "os.rename", "os.link", "os.symlink", "os.chmod", "os.chown",
              "os.truncate", "os.utime", "os.mkfifo", "os.mknod", "os.setxattr", "os.removexattr", "os.chflags",
              "shutil.rmtree", "shutil.copyfile", "shutil.move"}
    reads = {"os.listdir", "os.scandir", "glob.glob", "os.chdir"}
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    own_proc = ("/proc/self", "/proc/thread-self", "/proc/%d" % os.getpid())
    realpath, fsdecode = os.path.realpath, os.fsdecode
    def under(path, roots):
        if isinstance(path, int):
            return True  # an fd: it was opened under these rules
        path = realpath(fsdecode(path))
        return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)
    def readable_path(path):
        if isinstance(path, int):
            return True
        path = realpath(fsdecode(path))
        if path == "/proc" or path.startswith("/proc/"):  # its own entries only: others' environ, cmdline
            return path == "/proc" or under(path, own_proc)
        return under(path, [home, *readable])
    def hook(event, args):
        if event in deny:
            raise PermissionError(f"{event} is not allowed in this sandbox")
        if event == "import" and args[0] in ("ctypes", "_ctypes", "_posixsubprocess", "_posixshmem"):
            # _posixsubprocess starts processes and _posixshmem opens /dev/shm without an audit event
            raise PermissionError(f"importing {args[0]} is not allowed in this sandbox")
        if event == "open":
            path, mode, flags = args
            writing = (mode and any(c in mode for c in "wax+")) or (flags or 0) & write_flags
            if not (under(path, [home, "/dev/null"]) if writing else readable_path(path)):
                raise PermissionError(f"{'writing' if writing else 'reading'} {path!r} is not allowed in this sandbox")
        elif event in writes or event in reads:
            paths = [a for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))] or [args[0]]
            allowed = (lambda p: under(p, [home])) if event in writes else readable_path
            if not all(allowed(p) for p in paths):
                raise PermissionError(f"{event} {paths[0]!r} is not allowed in this sandbox")
    sys.addaudithook(hook)


def _run(source):
    import _ast  # the C module: importing ast (and traceback, json, re) would double the start-up time
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        body = compile(source, "<code>", "exec", _ast.PyCF_ONLY_AST).body
        last = body[-1:] if body and isinstance(body[-1], _ast.Expr) else []
        exec(compile(_ast.Module(body[: len(body) - len(last)], []), "<code>", "exec"), scope)
        if last:  # REPL: the value of a final expression is shown (repr; None is not)
            exec(compile(_ast.Interactive(last), "<code>", "single"), scope)
    except SystemExit:
        raise
    except BaseException as e:
        try:
            sys.stdout.flush()
        except BaseException:
            pass
        if isinstance(e, SyntaxError):
            line = f"{type(e).__name__}: {e}"
        else:
            import traceback
            line = traceback.format_exception_only(type(e), e)[-1].rstrip("\n")
        sys.stderr.write(line + "\n")
        sys.exit(1)


if __name__ == "__main__":
    _run(_prepare())
