"""The requests ``grpo vllm-serve`` accepts, checked field by field before the engine sees them: rows
of token ids inside the vocabulary, sampling settings of known names, types and ranges, weights files
from inside the server's weight folder whose tensors are the model's. A bad request is an HttpError
naming the field (and, for a path, never saying whether a file exists outside the folder)."""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from grpo.infra.http import HttpError


@dataclass
class SamplingLimits:
    """What one request may ask of the engine (``grpo vllm-serve`` flags)."""

    max_rows: int = 1024
    max_tokens: int = 4096
    max_logprobs: int = 20
    max_row_tokens: int = 32768  # a row's prompt (score: its tokens)


def _int(v, name: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise HttpError(400, name, f"{name}: an integer expected, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise HttpError(400, name, f"{name}: {v} is outside [{lo}, {hi}]")
    return v


def _float(v, name: str, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise HttpError(400, name, f"{name}: a number expected, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise HttpError(400, name, f"{name}: {v} is outside [{lo}, {hi}]")
    return float(v)


def _bool(v, name: str) -> bool:
    if not isinstance(v, bool):
        raise HttpError(400, name, f"{name}: true or false expected, got {type(v).__name__}")
    return v


def token_rows(rows, name: str, *, vocab: int | None, limits: SamplingLimits) -> list[list[int]]:
    """A non-empty list (at most max_rows) of non-empty token-id lists inside the vocabulary."""
    if not isinstance(rows, list) or not rows:
        raise HttpError(400, name, f"{name}: a non-empty list of token-id lists expected")
    if len(rows) > limits.max_rows:
        raise HttpError(413, name, f"{name}: {len(rows)} rows, over the limit of {limits.max_rows} (--max-rows)")
    top = (vocab or 2 ** 31) - 1
    for i, row in enumerate(rows):
        if not isinstance(row, list) or not row:
            raise HttpError(400, f"{name}[{i}]", f"{name}[{i}]: a non-empty list of token ids expected")
        if len(row) > limits.max_row_tokens:
            raise HttpError(413, f"{name}[{i}]", f"{name}[{i}]: {len(row)} tokens, over the limit of "
                            f"{limits.max_row_tokens} (--max-row-tokens)")
        for t in row:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= top:
                raise HttpError(400, f"{name}[{i}]", f"{name}[{i}]: {t!r} is not a token id in [0, {top}]")
    return rows


def sampling_params(p, i: int, *, vocab: int | None, limits: SamplingLimits) -> dict:
    """One row's SamplingParams keyword arguments, of the names grpo's client sends and nothing else."""
    name = f"params[{i}]"
    if not isinstance(p, dict):
        raise HttpError(400, name, f"{name}: an object expected, got {type(p).__name__}")
    top = (vocab or 2 ** 31) - 1
    checks = {
        "n": lambda v, f: _int(v, f, 1, 1),  # one request per row: a row's seed decides its tokens alone
        "max_tokens": lambda v, f: _int(v, f, 1, limits.max_tokens),
        "temperature": lambda v, f: _float(v, f, 0.0, 100.0),
        "top_p": lambda v, f: _float(v, f, 1e-9, 1.0),
        "top_k": lambda v, f: -1 if v == -1 and not isinstance(v, bool) else _int(v, f, 1, top + 1),
        "min_p": lambda v, f: _float(v, f, 0.0, 1.0),
        "repetition_penalty": lambda v, f: _float(v, f, 1e-6, 100.0),
        "seed": lambda v, f: None if v is None else _int(v, f, 0, 2 ** 63 - 1),
        "logprobs": lambda v, f: None if v is None else _int(v, f, 0, limits.max_logprobs),
        "ignore_eos": _bool, "detokenize": _bool,
        "stop_token_ids": lambda v, f: [_int(t, f, 0, top) for t in _short_list(v, f)],
    }
    out = {}
    for k, v in p.items():
        if k not in checks:
            raise HttpError(400, f"{name}.{k}", f"{name}.{k}: not a sampling setting this server takes; "
                            f"valid: {', '.join(checks)}")
        out[k] = checks[k](v, f"{name}.{k}")
    if "max_tokens" not in out:
        raise HttpError(400, f"{name}.max_tokens", f"{name}.max_tokens: required")
    return out


def _short_list(v, name: str) -> list:
    if not isinstance(v, list) or len(v) > 64:
        raise HttpError(400, name, f"{name}: a list of at most 64 token ids expected")
    return v


def generate_request(body: dict, *, vocab: int | None, limits: SamplingLimits) -> tuple[list, list[dict]]:
    prompts = token_rows(body.get("prompts"), "prompts", vocab=vocab, limits=limits)
    params = body.get("params")
    if not isinstance(params, list) or len(params) != len(prompts):
        raise HttpError(400, "params", f"params: a list of one settings object per prompt ({len(prompts)}) expected")
    return prompts, [sampling_params(p, i, vocab=vocab, limits=limits) for i, p in enumerate(params)]


def weights_path(value, weight_dir: str | None) -> str:
    """The real path of a weights file named in a request: only inside ``weight_dir`` (symbolic links
    resolved first), refused alike whether or not the file exists."""
    if weight_dir is None:
        raise HttpError(403, "path", "path: this server loads weights by path only from its --weight-dir, "
                        "and has none; send the file in the body")
    if not isinstance(value, str) or not value or "\0" in value:
        raise HttpError(400, "path", "path: a file name (a string) expected")
    root = os.path.realpath(weight_dir)
    real = os.path.realpath(value)
    if os.path.commonpath([root, real]) != root or real == root:
        raise HttpError(403, "path", "path: outside the server's --weight-dir; refused")
    if not os.path.isfile(real):
        raise HttpError(400, "path", "path: no such file in --weight-dir")
    return real


def safetensors_header(path: str) -> dict[str, dict]:
    """The tensors a safetensors file declares (name -> {"dtype", "shape", ...}); ValueError when the
    file is not one."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("shorter than a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, 100 << 20):
            raise ValueError(f"declares a {n}-byte header in a {size}-byte file")
        try:
            header = json.loads(f.read(n))
        except ValueError:
            raise ValueError("its header is not JSON") from None
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    header.pop("__metadata__", None)
    for name, t in header.items():
        if not isinstance(t, dict) or not isinstance(t.get("shape"), list) or not isinstance(t.get("dtype"), str):
            raise ValueError(f"tensor {name[:80]!r} has no dtype and shape")
    return header


def model_tensors(folder: str) -> dict[str, list[int]] | None:
    """Name -> shape of the tensors in a model folder's safetensors files; None for no such folder."""
    files = sorted(Path(folder).glob("*.safetensors")) if os.path.isdir(folder) else []
    if not files:
        return None
    return {k: v["shape"] for f in files for k, v in safetensors_header(str(f)).items()}


def check_weights_file(path: str, reference: dict[str, list[int]] | None) -> None:
    """HttpError 400 unless ``path`` is a safetensors file whose every tensor is one of the model's,
    with its shape: nothing of a wrong file reaches the engine."""
    try:
        header = safetensors_header(path)
    except (OSError, ValueError) as e:
        raise HttpError(400, "body", f"body: not a safetensors file ({e})") from None
    if not header:
        raise HttpError(400, "body", "body: a safetensors file without tensors")
    if reference is None:
        return
    for name, t in header.items():
        if name not in reference:
            raise HttpError(400, "body", f"body: tensor {name[:120]!r} is not one of the model's")
        if t["shape"] != reference[name]:
            raise HttpError(400, "body", f"body: tensor {name[:120]!r} has shape {t['shape']}, the model's is "
                            f"{reference[name]}")
