"""The registry's per-pair lock (``registry/cache.py``: ``filelock``, on every OS): a fetch in another process holds
a pair's lock, and a fetch of the same pair here waits for it, while another pair's does not."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from relaygen_integrations.registry.cache import pair_lock

# Takes the lock, says so, and holds it until its standard input closes.
HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from relaygen_integrations.registry.cache import pair_lock

    with pair_lock(Path(sys.argv[1]), sys.argv[2]):
        print("held", flush=True)
        sys.stdin.read()
    """
)


def test_a_pair_lock_held_by_another_process_is_waited_for(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path), "demo"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "held"
        with pair_lock(tmp_path, "other"):
            pass  # another pair's lock is free meanwhile
        entered = threading.Event()

        def fetch() -> None:
            with pair_lock(tmp_path, "demo"):
                entered.set()

        waiter = threading.Thread(target=fetch, daemon=True)
        waiter.start()
        assert not entered.wait(1.0), "the lock was taken while another process held it"
        holder.stdin.close()  # the holder leaves its `with`, releasing the lock, and exits
        assert holder.wait(timeout=30) == 0
        assert entered.wait(30), "the lock was not taken once the other process released it"
        waiter.join(timeout=5)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
