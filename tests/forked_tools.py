"""fairseq's tools, started fast. A fairseq tool spends ~3 s of CPU importing torch and
fairseq before it reads its first argument, and the suite runs over a hundred of them. Each test process therefore keeps
one server that has imported torch and fairseq (nothing of the plugin: --user-dir
imports it in every run, as in a fresh process) and forks it for every fairseq-train,
fairseq-validate and fairseq-preprocess that the tests and the code they call in
process start (fairseq_cli.console_script), and for the Python scripts the tests run
with python_script() or run() (the fairseq tools those start forked too): fairseq's own
cli_main or the script as __main__, with the command's argv, environment, working
directory and standard streams (passed over a Unix socket), its exit status returned
to a small client process that stands where the program stood. Other commands
(torchrun, the installed budget-* commands) start fresh as before; so does every
command where BUDGET_TESTS_FRESH_PROCESSES=1."""

import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

_ZYGOTE_ENV = "BUDGET_TESTS_ZYGOTE"
_ZYGOTE_TOOLS = {"fairseq-train": "fairseq_cli.train", "fairseq-validate": "fairseq_cli.validate",
                 "fairseq-preprocess": "fairseq_cli.preprocess"}

# the client: hands its streams, argv, environment and directory to the server and exits
# with the command's status; without a server it runs the console script itself
_CLIENT = r"""
import json, os, socket, sys
module, argv = sys.argv[1], sys.argv[2:]
path = os.environ.get("BUDGET_TESTS_ZYGOTE")
conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
try:
    conn.connect(path)
except (OSError, TypeError):
    os.execv(argv[0], argv)
request = json.dumps({"module": module, "argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
socket.send_fds(conn, [request], [0, 1, 2])
status = conn.recv(16)
sys.exit(int(status) if status else "the forked fairseq command ended without a status (killed?)")
"""

# the server: imports torch and fairseq once, then forks a child per request; it ends
# when the test process that started it closes its standard input
_SERVER = r"""
import importlib.util, json, logging, os, runpy, select, signal, socket, sys, threading, traceback
path, CLIENT, TOOLS = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
import torch, fairseq_cli.train, fairseq_cli.validate, fairseq_cli.preprocess  # noqa: E401
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
server.bind(path + ".tmp")
server.listen(64)
os.rename(path + ".tmp", path)  # the socket appears when the server is ready


class ForkedTools:
    # makes the plugin's fairseq_cli.console_script, once a script imports it, fork the
    # fairseq tools from this server too

    def find_spec(self, name, path, target=None):
        if name != "budget_plugin.tools.fairseq_cli":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            fresh = module.console_script

            def console_script(name):
                program = fresh(name)
                if name not in TOOLS or len(program) != 1:
                    return program
                return [sys.executable, "-c", CLIENT, TOOLS[name], *program]

            module.console_script = console_script

        spec.loader.exec_module = exec_module
        return spec


def child(conn, request, fds):
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    threads = os.environ.get("OMP_NUM_THREADS", "")
    torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) > 0 else os.cpu_count() or 1)
    import random
    import numpy
    random.seed()
    numpy.random.seed()
    module = request["module"]
    script = module.partition("script:")[2]
    sys.argv = request["argv"][1:] if script else request["argv"]
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))  # as for a program started fresh
    # the client killed (a timeout): the command goes down with it
    threading.Thread(target=lambda: (conn.recv(1), os.kill(os.getpid(), signal.SIGKILL)), daemon=True).start()
    code = 0
    try:
        if script:
            logging.root.handlers.clear()  # a fresh interpreter's logging (fairseq_cli's import set INFO)
            logging.root.setLevel(logging.WARNING)
            sys.meta_path.insert(0, ForkedTools())
            runpy.run_path(script, run_name="__main__")
        else:
            __import__(module, fromlist=["cli_main"]).cli_main()
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            code = exit_.code or 0
        else:
            print(exit_.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    conn.send(str(code).encode())
    os._exit(code)


while True:
    ready, _, _ = select.select([server, sys.stdin], [], [])
    if sys.stdin in ready:  # the test process is gone
        os._exit(0)
    conn, _ = server.accept()
    message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    if os.fork() == 0:
        server.close()
        child(conn, json.loads(message), fds)
    conn.close()
    for fd in fds:
        os.close(fd)
"""


_zygote = {}  # this test process's server and its socket, while it runs


def _zygote_ready() -> bool:
    """Whether the server is there to fork a command; its first command waits for its
    imports (a fresh start would pay them again beside it)."""
    if not _zygote:
        return False
    for _ in range(1200):
        if os.path.exists(_zygote["path"]):
            return True
        if _zygote["server"].poll() is not None:
            return False
        time.sleep(0.05)
    return False


def _zygote_console_script(fresh, name):
    program = fresh(name)
    if name not in _ZYGOTE_TOOLS or len(program) != 1 or not _zygote_ready():
        return program
    return [sys.executable, "-c", _CLIENT, _ZYGOTE_TOOLS[name], *program]


@contextlib.contextmanager
def fairseq_tools_forked(fairseq_cli):
    """Within the block, ``fairseq_cli.console_script`` (which helpers.run and the
    plugin's run() use) is the client of this test process's server (above)."""
    if os.environ.get("BUDGET_TESTS_FRESH_PROCESSES") == "1":
        yield
        return
    folder = tempfile.mkdtemp(prefix="bz-")  # short: a socket's path has at most 107 bytes
    path = os.path.join(folder, "tools")
    server = subprocess.Popen([sys.executable, "-c", _SERVER, path, _CLIENT, json.dumps(_ZYGOTE_TOOLS)],
                              stdin=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=dict(os.environ, PYTHONHASHSEED="0", PYTHONUNBUFFERED="1"))
    fresh = fairseq_cli.console_script
    forked = functools.partial(_zygote_console_script, fresh)
    forked.fresh = fresh  # what a fresh process runs (test_tools checks it)
    os.environ[_ZYGOTE_ENV] = path
    _zygote.update(path=path, server=server)
    fairseq_cli.console_script = forked
    try:
        yield
    finally:
        fairseq_cli.console_script = fresh
        os.environ.pop(_ZYGOTE_ENV, None)
        _zygote.clear()
        server.stdin.close()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(folder, ignore_errors=True)


def python_script(path):
    """The command line of ``python path`` as the tests run it (see above)."""
    if _zygote_ready():
        return [sys.executable, "-c", _CLIENT, f"script:{path}", sys.executable, str(path)]
    return [sys.executable, str(path)]
