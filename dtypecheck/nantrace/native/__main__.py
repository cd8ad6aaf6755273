"""``python -m dtypecheck.nantrace.native``: build nan-trace's C++ checks now (``make .venv`` runs it)."""

from __future__ import annotations

import sys
import time

from dtypecheck.nantrace.native import build, compiler_available, dispatch_built


def main() -> int:
    quiet = "--quiet" in sys.argv[1:]
    if not compiler_available():
        print("note: no C++ compiler or ninja: watch mode uses its pure-Python checks", file=sys.stderr)
        return 0
    start = time.perf_counter()
    try:
        library = build()
    except Exception as exc:  # noqa: BLE001  (any build failure leaves the pure-Python checks, said in one line)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"note: nan-trace's C++ checks did not build ({first}): it uses its pure-Python checks", file=sys.stderr)
        return 0
    if not quiet:
        print(f"nan-trace's C++ checks: {library} ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
        if not dispatch_built():
            print(
                "note: the full trace's C++ per-op path did not build against this torch: its Python mode takes "
                "every op",
                file=sys.stderr,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
