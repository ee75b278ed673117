"""The ``rollout-buffer`` console script: the server and tools of the Rust binary, run in
this process by the extension (installed with the package, no separate ``cargo install``)::

    rollout-buffer serve --store ./run --listen 127.0.0.1:8889 --group-size 8
    rollout-buffer inspect ./run --tail 5
    rollout-buffer repair ./run

``python -m rollout_buffer.cli ...`` is the same. The arguments and behaviour are the
binary's (``docs/server.md``); SIGTERM or Ctrl-C stop ``serve`` gracefully (it flushes the
buffer and exits 0).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any, Iterable, List, Optional

from . import _native


def main(argv: Optional[List[str]] = None) -> None:
    """Runs the command line (``sys.argv`` by default) and exits with its code.

    ``argv`` is a list of str (or path-like) arguments, without the program name; one
    str is a ``ValueError`` (it would run as one argument per character)."""
    args = sys.argv[1:] if argv is None else _arguments(argv)
    if any(not _utf8(a) for a in args):
        # sys.argv holds bytes that are not UTF-8 as lone surrogates (surrogateescape);
        # the extension cannot take them and raised a UnicodeEncodeError traceback, where
        # the binary's parser answers with this error and exit code 2.
        sys.stderr.write(
            "error: invalid UTF-8 was detected in one or more arguments\n\n"
            "For more information, try '--help'.\n"
        )
        sys.exit(2)
    # The server handles SIGINT itself (a graceful stop, exit 0). Python's own handler
    # would then raise KeyboardInterrupt once the call returns, turning that clean stop
    # into a traceback, so the signal is left to the server alone while it runs, and
    # Python's handler is put back afterwards (for a caller that catches SystemExit).
    # Only the main thread may set handlers (elsewhere signal.signal raises ValueError),
    # and only there does Python run them.
    restore = None
    if threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            restore = signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        code = _native.cli_main(["rollout-buffer", *args])
    finally:
        if restore is not None:
            signal.signal(signal.SIGINT, restore)
    sys.exit(code)


def _arguments(argv: Iterable[Any]) -> List[str]:
    if isinstance(argv, (str, bytes, os.PathLike)) or not isinstance(argv, Iterable):
        raise ValueError(f"argv must be a list of str arguments, not {type(argv).__name__} {argv!r}")
    args = []
    for i, a in enumerate(argv):
        a = os.fspath(a) if isinstance(a, os.PathLike) else a
        if not isinstance(a, str):
            raise ValueError(f"argv[{i}] must be a str, not {type(a).__name__} {a!r}")
        args.append(a)
    return args


def _utf8(arg: str) -> bool:
    try:
        arg.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


if __name__ == "__main__":
    main()
