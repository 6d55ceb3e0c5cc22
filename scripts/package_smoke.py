"""What a user of the installed package gets, checked from outside the checkout (run by ``scripts/package_check.sh``
in a fresh virtualenv that holds the wheel and nothing of the repository).

It imports both adapters, finds the package data a wheel must carry (the demo's GSM8K problems, the shipped
profiles), runs ``relaygen demo --help``, and answers one shipped problem with ``relaygen bench`` on a tiny
random-weight pair (``--pair DIR`` holding ``large/`` and ``small/``: the tests' ``tiny_qwen2``, saved by
package_check.sh), so the engine, the bench and its report (matplotlib) run from the installed files.
``--imports-only`` stops after the imports and the data (the floor install: its point is that the declared floors
import).

Exit status 0 when everything held; otherwise the first failure, named.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path


def check_imports_and_data() -> None:
    from relaygen_integrations.langchain.chat_model import RelayChatModel
    from relaygen_integrations.llama_index.llm import RelayLLM
    from relaygen_integrations.prompts import load_gsm8k

    package = resources.files("relaygen_integrations")
    location = Path(str(package))
    if "site-packages" not in location.parts:
        raise SystemExit(f"relaygen_integrations imported from {location}, not from the installed wheel")
    problems = load_gsm8k()
    profiles = sorted(p.name for p in (package / "profiles").iterdir() if p.name.endswith(".json"))
    if not problems or not profiles:
        raise SystemExit(f"the wheel lacks its data: {len(problems)} demo problems, profiles {profiles}")
    print(f"imports: {RelayChatModel.__name__}, {RelayLLM.__name__}; {len(problems)} demo problems; {profiles}")


def run(command: list[str]) -> None:
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", type=Path, help="a directory holding large/ and small/ checkpoints")
    parser.add_argument("--imports-only", action="store_true")
    args = parser.parse_args()
    check_imports_and_data()
    if args.imports_only:
        return 0
    if args.pair is None:
        parser.error("--pair is required unless --imports-only")
    relaygen = shutil.which("relaygen", path=str(Path(sys.executable).parent))
    if relaygen is None:
        raise SystemExit(f"no relaygen script next to {sys.executable}")
    run([relaygen, "demo", "--help"])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench"
        pair = ["--large", str(args.pair / "large"), "--small", str(args.pair / "small"), "--dtype", "fp32"]
        budget = ["--n", "1", "--modes", "large,relay", "--max-new-tokens", "16"]
        run([relaygen, "bench", *pair, *budget, "--out", str(out)])
        saved = json.loads((out / "results.json").read_text())
        modes = sorted(run["mode"] for run in saved["runs"])
        written = {p.name for p in out.iterdir()}
        if modes != ["large", "relay"] or not {"report.md", "speed_accuracy.png"} <= written:
            raise SystemExit(f"the bench wrote {modes} and {sorted(written)} in {out}")
        print(f"bench: one answer per mode ({', '.join(modes)}), report and plot written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
