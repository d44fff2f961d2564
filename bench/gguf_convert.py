"""The demo model's conversion: transformers' GGUF loader against ``rredcot.models.gguf_llama``.

Each way runs in a fresh process, imports included, as a first run's worker converts: transformers'
``from_pretrained(gguf_file=...)`` and its tokenizer read from the GGUF (what ``models.smollm``
did before 2026-12-06), against ``read_gguf`` with the tokenizer builtin's files copied (the builtin
built beforehand, as a first run's training pairs build it). The ways alternate, ``--repeats``
times; each process's wall time and CPU seconds. The two outputs' weights are compared byte for byte.
Prints a table; the last line is one JSON object.

    rredcot bench gguf_convert [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rredcot.launch.arguments import bounded_int

TRANSFORMERS = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from safetensors.torch import save_file
from rredcot.models.smollm import gguf_path
src, out = gguf_path(), sys.argv[1]
model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"},
          out + "/model.safetensors", metadata={"format": "pt"})
AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name).save_pretrained(out)
"""
READER = """
import sys
from pathlib import Path
from rredcot.models.smollm import _convert
_convert(Path(sys.argv[1]))  # beside the tokenizer builtin
"""


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=bounded_int(1, 10), default=2, help="conversions each way")
    return p.parse_args()


def timed(code: str, out: Path) -> dict[str, float]:
    """``code`` in a fresh Python with ``out`` as its argument: wall and CPU seconds of that process."""
    before, t = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run([sys.executable, "-c", code, str(out)], check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {"wall_s": time.perf_counter() - t, "cpu_s": cpu}


def main() -> None:
    args = parse()
    from rredcot.common.precision import cpu_info
    from rredcot.models.smollm import smollm2_tokenizer_dir

    ways = {"transformers": TRANSFORMERS, "gguf_llama": READER}
    runs: dict[str, list[dict[str, float]]] = {way: [] for way in ways}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        smollm2_tokenizer_dir(root)  # the reader's way copies its files
        for repeat in range(args.repeats):
            for way, code in ways.items():
                out = root / f"{way}-{repeat}"
                if way == "transformers":
                    out.mkdir()
                runs[way].append(timed(code, out))
        same = (root / "transformers-0" / "model.safetensors").read_bytes() == (
            root / "gguf_llama-0" / "model.safetensors"
        ).read_bytes()
    median = {w: {m: statistics.median(r[m] for r in rs) for m in ("wall_s", "cpu_s")} for w, rs in runs.items()}
    print(f"SmolLM2-135M's GGUF to a Hugging Face directory on {cpu_info().describe()}; median of {args.repeats}")
    print(f"{'way':>13} {'wall s':>7} {'CPU s':>7} {'CPU vs transformers':>20}")
    for way, m in median.items():
        print(f"{way:>13} {m['wall_s']:7.2f} {m['cpu_s']:7.2f} {m['cpu_s'] / median['transformers']['cpu_s']:19.2f}x")
    print(f"weights byte for byte the same: {same}")
    print(json.dumps({"repeats": args.repeats, "median": median, "runs": runs, "same_weights": same}))


if __name__ == "__main__":
    main()
