"""A trained run exported as GGUF, answered by llama.cpp (llama-cpp-python) and by transformers.

`grpo export RUN --format gguf --quant Q` for each --quants; the run's first --prompts held-out prompts,
rendered with its chat template; greedy answers (up to --max-new-tokens) from transformers on the run's
checkpoint and from llama.cpp on the GGUF file (temperature 0, no repeat penalty, the file's own
tokenizer and end-of-generation tokens). Prints, per quantisation: the prompts llama.cpp tokenizes to the
same ids as transformers, the answers whose text is the same, and those whose final number is the same.

llama-cpp-python compiles llama.cpp at install, so it lives in a venv of its own (--llama-python):

    python3 -m venv /tmp/llvenv && /tmp/llvenv/bin/pip install llama-cpp-python
    python bench/gguf_llamacpp.py RUN --llama-python /tmp/llvenv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import commit, cpu_line  # noqa: E402

LLAMA = r"""
import json, sys
import llama_cpp
from llama_cpp import Llama
path, prompts, max_new, extra = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3]), sys.argv[4] == "1"
defaults = llama_cpp.llama_model_default_params
def params():  # use_extra_bufts: llama.cpp's repacked (and AMX) weight buffers for quantised matrices
    p = defaults()
    p.use_extra_bufts = extra
    return p
llama_cpp.llama_cpp.llama_model_default_params = params
llama_cpp.llama_model_default_params = params
llm = Llama(model_path=path, n_ctx=1024, n_threads=2, verbose=False, seed=0)
out = []
for text in prompts:
    ids = llm.tokenize(text.encode(), add_bos=False, special=True)
    got = llm.create_completion(text, max_tokens=max_new, temperature=0.0, top_k=1, top_p=1.0, min_p=0.0,
                                repeat_penalty=1.0)
    out.append({"ids": ids, "text": got["choices"][0]["text"]})
print(json.dumps(out))
"""


def last_number(text: str) -> str | None:
    found = re.findall(r"-?\d+(?:\.\d+)?", text.replace(",", ""))
    return found[-1] if found else None


def transformers_answers(run: Path, prompts: list[str], max_new: int) -> list[dict]:
    import torch

    from grpo.serve.models import load_policy, source_of

    model, tok = load_policy(source_of(str(run)))
    out = []
    for text in prompts:
        ids = tok(text, return_tensors="pt", add_special_tokens=False).input_ids
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        out.append({"ids": ids[0].tolist(), "text": tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--quants", nargs="+", default=["f16", "q8_0"])
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--llama-python", default="/tmp/llvenv/bin/python")
    args = ap.parse_args()
    from grpo.config.io import load_config
    from grpo.data.tasks import render_prompt
    from grpo.serve.models import export, load_policy, source_of
    from grpo.train.settings import held_out_prompts

    cfg = load_config(args.run / "config.yaml")
    _, tok = load_policy(source_of(str(args.run)))
    prompts = [render_prompt(tok, p, cfg.system_prompt) for p in held_out_prompts(cfg, args.prompts)]
    print(f"cpu: {cpu_line()}; commit {commit()}; load average {os.getloadavg()[0]:.2f}; run {args.run}; "
          f"{len(prompts)} held-out prompts, greedy, up to {args.max_new_tokens} new tokens")
    ref = transformers_answers(args.run, prompts, args.max_new_tokens)
    print("| GGUF | file size | same prompt token ids | same answer text | same final number |\n|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for quant in args.quants:
            out = Path(tmp) / quant
            export(str(args.run), out, fmt="gguf", quant=quant)
            (gguf,) = out.glob("*.gguf")
            (Path(tmp) / "prompts.json").write_text(json.dumps(prompts))
            note = ""
            for extra in ("1", "0"):  # llama.cpp's defaults first; where they crash, without its extra buffers
                proc = subprocess.run([args.llama_python, "-c", LLAMA, str(gguf), str(Path(tmp) / "prompts.json"),
                                       str(args.max_new_tokens), extra], capture_output=True, text=True)
                if proc.returncode == 0:
                    break
                note = (f" (llama.cpp's default load died with signal {-proc.returncode}; run with "
                        "use_extra_bufts=false)" if proc.returncode < 0 else f" (exit {proc.returncode})")
            if proc.returncode != 0:
                raise SystemExit(f"llama.cpp failed on {gguf.name}{note}: {proc.stderr[-3000:]}")
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            same_ids = sum(a["ids"] == b["ids"] for a, b in zip(ref, got))
            same_text = sum(a["text"].strip() == b["text"].strip() for a, b in zip(ref, got))
            same_num = sum(last_number(a["text"]) == last_number(b["text"]) for a, b in zip(ref, got))
            n = len(prompts)
            print(f"| {quant}{note} | {gguf.stat().st_size / 2**20:.0f} MiB | {same_ids}/{n} | {same_text}/{n} | "
                  f"{same_num}/{n} |", flush=True)
            for a, b in zip(ref, got):
                if a["text"].strip() != b["text"].strip():
                    print(f"    differs: transformers {a['text']!r} / llama.cpp {b['text']!r}")


if __name__ == "__main__":
    main()
