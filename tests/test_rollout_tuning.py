"""The decode kernels are chosen by measurement: every product computes F.linear's result at any
row count, the plan keeps the fastest measured candidate per role and reads it back from the cache,
the config overrides it, and rollout_engine=auto runs whichever backend measured faster. The C file
built for AVX2 (as on an AVX-512 machine run as an AVX2 one) computes the same products."""

import pytest
import torch

from grpo.config import Config, ConfigError
from grpo.infra.process_cache import ProcessCache
from grpo.models import load_models
from grpo.rollout import SamplingSettings, choice, make_engine, native, resolve_engine, tuning
from grpo.rollout.keys import row_keys
from tests.conftest import need_native


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    """Each test measures into a cache folder of its own, with this process's memory of plans empty."""
    monkeypatch.setenv("GRPO_CACHE", str(tmp_path))
    monkeypatch.setattr(tuning, "MEASURED", ProcessCache("this test's", stale_when="the test ends"))


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    m = load_models(str(tiny_model_dir), need_reference=False)
    return m.policy, m.tokenizer


@pytest.mark.parametrize("name", list(tuning.PRODUCTS))
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 17])
def test_every_product_computes_the_linear(name, rows):
    if tuning.PRODUCTS[name].unavailable():
        pytest.skip(tuning.PRODUCTS[name].unavailable())
    torch.manual_seed(rows)
    weight, bias = torch.randn(96, 40), torch.randn(96)
    fn = tuning.PRODUCTS[name].make(weight, bias)
    # a bfloat16 product is the float32 product of x and the weight rounded to bfloat16
    read = weight.to(torch.bfloat16).float() if tuning.PRODUCTS[name].precision == "bfloat16" else weight
    for n in (rows, max(1, rows - 2), rows):  # the row count changes as rows end (panel: padded blocks)
        x = torch.randn(n, 40)
        torch.testing.assert_close(fn(x), torch.nn.functional.linear(x, read, bias), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("name", ["panel", "panel_bf16"])
def test_a_panel_products_row_is_bitwise_the_same_beside_any_rows(name):
    """Passes of 8 rows and one of the 1-7 left sum each row in one order: a row's output does not
    depend on how many rows share the step (continuous batching changes that count every step)."""
    need_native()
    torch.manual_seed(0)
    weight = torch.randn(64, 40)  # two panels on AVX-512, eight on AVX2
    fn = tuning.PRODUCTS[name].make(weight, None)
    x = torch.randn(15, 40)
    alone = torch.stack([fn(x[i:i + 1])[0].clone() for i in range(15)])
    for n in range(1, 16):
        assert torch.equal(fn(x[:n]), alone[:n]), n


def test_the_bfloat16_panel_reads_rounded_weights_and_plans_keep_their_precision(tiny):
    """panel_bf16 differs from the float32 product by the weight's rounding, which a float32 plan
    never chooses; a bfloat16 plan measures only bfloat16 products; a rollout cannot be given one."""
    need_native()
    weight, x = torch.randn(64, 24), torch.randn(3, 24)
    got = tuning.PRODUCTS["panel_bf16"].make(weight, None)(x)
    torch.testing.assert_close(got, x @ weight.to(torch.bfloat16).float().T, atol=1e-5, rtol=1e-5)
    assert (got - x @ weight.T).abs().max() > 1e-4  # the rounding shows: not the float32 product
    model, _ = tiny
    exact = tuning.kernel_plan(model, 4)
    assert all(tuning.PRODUCTS[p].precision == "float32" for p in exact.products.values())
    assert all(tuning.PRODUCTS[n].precision == "float32" for s in exact.seconds.values() for n in s)
    half = tuning.kernel_plan(model, 4, dtype="bfloat16")
    assert set(half.products.values()) == {"panel_bf16"} and half is not exact
    both = tuning.kernel_plan(model, 4, dtype="auto")
    assert all("panel_bf16" in s and "panel" in s for s in both.seconds.values())
    with pytest.raises(ValueError, match="panel_bf16 reads the weights in bfloat16; this decode runs float32"):
        tuning.kernel_plan(model, 4, "panel_bf16")
    with pytest.raises(ConfigError, match="decode_kernels: panel_bf16 reads the weights in bfloat16"):
        Config(decode_kernels="head=panel_bf16")


def test_the_avx2_build_computes_the_same_products(monkeypatch):
    """decode_ops.c built for x86-64-v3 (AVX2 + FMA, no AVX-512: bench/as_avx2.sh) has 8 lanes and
    8-column panels, and its panel product equals F.linear, like the native build's."""
    need_native()
    with monkeypatch.context() as m:  # the variable as it was after (bench/as_avx2.sh sets it already)
        m.setenv("GRPO_NATIVE_MARCH", "x86-64-v3")
        assert "-march=x86-64-v3" in native.flags()
        lib = native.load(native.built(native.compiler(), native.flags()))
    assert lib.vector_lanes() == 8 and lib.panel_width() == 8
    assert native.library().panel_width() in (8, 32)  # this machine's own build: AVX2 or AVX-512
    weight, x = torch.randn(64, 24), torch.randn(5, 24)
    for built in (lib, native.library()):
        got = native.panel_product(built, weight, None)(x)
        torch.testing.assert_close(got, x @ weight.T, atol=1e-4, rtol=1e-5)
        half = native.panel_product(built, weight, None, bfloat16=True)(x)
        torch.testing.assert_close(half, x @ weight.to(torch.bfloat16).float().T, atol=1e-4, rtol=1e-5)


def test_the_plan_keeps_the_fastest_measured_kernel_and_reads_it_back(tiny):
    model, _ = tiny
    plan = tuning.kernel_plan(model, 8)
    assert plan.source == "measured" and set(plan.products) == set(tuning.ROLES)
    for role, seconds in plan.seconds.items():
        assert plan.products[role] == min(seconds, key=seconds.get)  # the argmin of what was timed
        assert set(seconds) == {n for n, p in tuning.PRODUCTS.items() if p.unavailable() is None
                                and p.precision == "float32"}
    messages = tuning.take_messages()
    assert len(messages) == 1 and messages[0].startswith("decode kernels (measured, 8 rows")
    assert tuning.kernel_plan(model, 8) is plan and tuning.take_messages() == []  # once per process
    tuning.MEASURED.clear()
    again = tuning.kernel_plan(model, 8)  # a new process: from the cache folder, not measured again
    assert again.source == "cache" and again.products == plan.products
    assert tuning.kernel_plan(model, 16).source == "measured"  # another row count is another shape


def test_the_config_overrides_roles(tiny):
    model, _ = tiny
    assert tuning.kernel_plan(model, 8, "mkl").products == dict.fromkeys(tuning.ROLES, "mkl")
    mixed = tuning.kernel_plan(model, 8, "head=onednn,qkv=mkl")
    assert mixed.products["head"] == "onednn" and mixed.products["qkv"] == "mkl"
    assert mixed.source == "config + measured" and "head" not in mixed.seconds
    with pytest.raises(ValueError, match="unknown product 'fast'; valid: auto, panel, onednn, mkl, panel_bf16"):
        tuning.parse_override("fast")
    with pytest.raises(ValueError, match="unknown role 'lm'"):
        tuning.parse_override("lm=mkl")
    with pytest.raises(ConfigError, match="decode_kernels: unknown product"):
        Config(decode_kernels="qkv=gemm")


def test_auto_runs_the_backend_that_measured_faster(tiny):
    """The decision is the argmin of the two measured steps, kept for the next call, and the rollout
    auto runs is that backend's; both draw the same tokens (test_rollout_fast), so only speed differs."""
    model, tok = tiny
    backend = resolve_engine("auto", model, rows=4, group_size=2)
    key = tuning.plan_key(model, 4, kind=choice.backend_kind("auto", peft=False))
    decision = tuning.read_cached(key)
    assert backend == ("fast" if decision["fast"] <= decision["hf"] else "hf")
    assert any(m.startswith("rollout_engine auto (measured, 4 rows") for m in tuning.take_messages())
    ro = make_engine("auto", model, tok).generate(["Hi", "x"], group_size=2, sampling=SamplingSettings(4, temperature=1.0, max_prompt_length=1024),
                                                  keys=row_keys(0, 0, 0, 4))
    assert ro.engine == backend
    assert resolve_engine("auto", model) == "fast"  # no row count given: the architecture decides


def test_a_burst_of_load_in_one_round_does_not_decide_the_backend(tiny, monkeypatch):
    """Each backend is timed in alternating rounds and its fastest round counts: fast's first round
    slowed 1000x by load still gives fast, and the order of the measurements alternates so that a
    change of load favours neither."""
    model, _ = tiny
    order: list[str] = []
    fast_times = iter([5.0] + [0.004] * (choice.ROUNDS - 1))

    def fast(*a, **k):
        order.append("fast")
        return next(fast_times)

    def hf(*a, **k):
        order.append("hf")
        return 0.005

    monkeypatch.setattr(choice, "fast_step_seconds", fast)
    monkeypatch.setattr(choice, "hf_step_seconds", hf)
    assert resolve_engine("auto", model, rows=4, group_size=2) == "fast"
    assert order[:4] == ["fast", "hf", "hf", "fast"] and len(order) == 2 * choice.ROUNDS
    decision = tuning.read_cached(tuning.plan_key(model, 4, kind=choice.backend_kind("auto", peft=False)))
    assert decision == {"backend": "fast", "fast": 0.004, "hf": 0.005}


def test_a_lora_policy_samples_on_the_fast_path_with_the_same_tokens(tiny):
    """LoRA adapters (made non-trivial) are merged into the fast step's weights: the fast backend
    draws exactly the tokens ``generate`` draws from the PEFT model."""
    import copy

    from peft import LoraConfig, get_peft_model

    from grpo.rollout import fast_rollout, generate_rollout
    model, tok = tiny
    lora = get_peft_model(copy.deepcopy(model), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    torch.manual_seed(0)
    for name, p in lora.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.3)
    kw = dict(group_size=3, max_new_tokens=10, temperature=1.0, keys=row_keys(1, 2, 0, 6))
    ref = generate_rollout(lora, tok, ["What is 1 + 1?", "Hi"], **kw)
    fast = fast_rollout(lora, tok, ["What is 1 + 1?", "Hi"], kernels="mkl", **kw)  # pinned, not timed
    assert torch.equal(fast.completion_ids, ref.completion_ids)
    plain = generate_rollout(model, tok, ["What is 1 + 1?", "Hi"], **kw)
    assert not torch.equal(plain.completion_ids, ref.completion_ids)  # the adapters changed the policy


def test_a_corrupt_or_unwritable_cache_is_measured_again(tiny, tmp_path, monkeypatch):
    model, _ = tiny
    key = tuning.plan_key(model, 8)
    path = tmp_path / f"kernels-{key}.json"
    path.write_text('{"products": {"qkv": "panel"')  # cut short, as by a crash mid-write elsewhere
    assert tuning.kernel_plan(model, 8).source == "measured"
    assert set(tuning.read_cached(key)["products"]) == set(tuning.ROLES)  # rewritten whole
    tuning.MEASURED.clear()
    monkeypatch.setenv("GRPO_CACHE", str(tmp_path / "file"))
    (tmp_path / "file").write_text("")  # the cache folder's name is taken by a file: nothing can be written
    assert tuning.kernel_plan(model, 8).source == "measured"
