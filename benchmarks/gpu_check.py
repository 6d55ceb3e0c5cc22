"""Device check: what one decode step of each model costs eagerly (DynamicCache), with a static cache, and with a
static cache under ``torch.compile(mode="reduce-overhead")`` (CUDA graphs on a GPU); the cost ratio r = small/large
for each; what a pass over k positions costs in steps; and the relay speed-up those costs predict,
1/((1-f)+f*r) at the demo pair's measured small share f. Where the demo pair is on disk, the engine's own large /
relay / relay-spec tokens/s on a GSM8K question are measured too; elsewhere random-weight models of the demo pair's
shapes stand in (speed only: their text is noise).

    bash benchmarks/gpu_check.sh [--device cuda] [--steps 64] [--tiny] [--no-compile]
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time
from collections.abc import Callable

import torch
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM, StaticCache

# f of relay on the demo pair over GSM8K: 0.35 for `relay` and 0.34 for `reprompt` in benchmarks/data/demo-n20; kept at
# the 0.33 the H200 check ran with (benchmarks/data/gpu-h200), so that a rerun compares with it.
SMALL_SHARE = 0.33
SHAPES = {  # the demo pair (Qwen2.5-Coder-1.5B / 0.5B-Instruct)
    "large": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12},
    "small": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14},
}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}


def random_model(role: str, tiny: bool, device: torch.device, dtype: torch.dtype) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=151936, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=role == "small",
        **(TINY if tiny else SHAPES[role]),
    )  # fmt: skip
    return Qwen2ForCausalLM(config).to(device=device, dtype=dtype).eval()


def demo_pair(device: torch.device, dtype: torch.dtype) -> dict[str, torch.nn.Module] | None:
    """The demo pair's converted weights if they are on this machine (never fetched here: a device machine may have
    no network)."""
    from relaygen_integrations.engine.local.loading import load_causal_lm
    from relaygen_integrations.registry import pair_paths

    paths = pair_paths("demo", "bf16")
    if paths is None:
        return None
    return {
        "large": load_causal_lm(str(paths.large), dtype, device),
        "small": load_causal_lm(str(paths.small), dtype, device),
    }


def timed(device: torch.device, fn: Callable[[], object]) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def decode_ms(model: torch.nn.Module, device: torch.device, steps: int, variant: str) -> float:
    """Median ms per one-token step after a 256-token prefill, for ``eager`` / ``static`` / ``compiled``. The static
    variants use the engine's own block-rounded cache size and compiled step (``engine/local/kv.py``), so the engine
    runs below find the compiled graph in inductor's cache instead of compiling it again."""
    from relaygen_integrations.engine.local.kv import DEFAULT_BLOCK, capacity, compile_decode_step

    prompt = torch.randint(1000, 20000, (1, 256), device=device)
    if variant == "eager":
        cache: DynamicCache | StaticCache = DynamicCache(config=model.config)
    else:
        cache = StaticCache(config=model.config, max_cache_len=capacity(256 + steps + 8, DEFAULT_BLOCK))
    forward = compile_decode_step(model) if variant == "compiled" else model
    kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.inference_mode():
        model(prompt, use_cache=True, position_ids=torch.arange(256, device=device)[None], **{kwarg: cache})
        token, times = prompt[:, -1:], []
        for step in range(steps + 3):  # the first calls compile / capture: not timed
            position = torch.tensor([[256 + step]], device=device)

            def one(position: torch.Tensor = position) -> None:
                nonlocal token
                out = forward(
                    input_ids=token, use_cache=True, position_ids=position, logits_to_keep=1, **{kwarg: cache}
                )
                token = out.logits[:, -1:].argmax(-1)

            seconds = timed(device, one)
            if step >= 3:
                times.append(seconds)
    return statistics.median(times) * 1000


def pass_steps(model: torch.nn.Module, device: torch.device) -> dict[int, float]:
    """A forward over k positions (eager, DynamicCache, all logits kept) in one-token steps."""
    cache = DynamicCache(config=model.config)
    kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.inference_mode():
        model(torch.randint(1000, 20000, (1, 256), device=device), use_cache=True, **{kwarg: cache})
        costs: dict[int, list[float]] = {k: [] for k in (1, 4, 8, 32)}
        for _ in range(5):
            for k in costs:
                ids = torch.randint(1000, 20000, (1, k), device=device)
                costs[k].append(timed(device, lambda ids=ids, k=k: model(ids, logits_to_keep=k, **{kwarg: cache})))
                cache.crop(-k)
    one = statistics.median(costs[1])
    return {k: statistics.median(v) / one for k, v in costs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--tiny", action="store_true", help="tiny random models (a smoke test of this script)")
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--tokens", type=int, default=0, help="tokens per engine run (default: 256 GPU, 96 CPU)")
    parser.add_argument("--skip-engine", action="store_true", help="only the per-step and per-pass costs")
    parser.add_argument(
        "--tokenizer", default=None, help="a tokenizer folder of the demo pair: without its weights, the engine's own "
        "loop in mode large runs on the random models (its per-token overhead over the raw step)",
    )  # fmt: skip
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device {name}, torch {torch.__version__}, bf16")
    pair = None if args.tiny else demo_pair(device, dtype)
    print("models:", "the demo pair" if pair else "random weights of the demo pair's shapes" + " (tiny)" * args.tiny)
    models = pair or {role: random_model(role, args.tiny, device, dtype) for role in ("large", "small")}
    variants = ["eager", "static"] + (["compiled"] if args.compile else [])
    ms = {role: {v: decode_ms(models[role], device, args.steps, v) for v in variants} for role in models}
    print(f"\n| variant | large ms/step | small ms/step | r | predicted relay speed-up at f={SMALL_SHARE} |")
    print("|---|---|---|---|---|")
    for v in variants:
        r = ms["small"][v] / ms["large"][v]
        ideal = 1 / ((1 - SMALL_SHARE) + SMALL_SHARE * r)
        print(f"| {v} | {ms['large'][v]:.2f} | {ms['small'][v]:.2f} | {r:.2f} | {ideal:.2f}x |")
    print("\n| model | k=1 | k=4 | k=8 | k=32 (eager pass over k positions, in one-token steps) |")
    print("|---|---|---|---|---|")
    for role, model in models.items():
        steps = pass_steps(model, device)
        print(f"| {role} | " + " | ".join(f"{steps[k]:.2f}" for k in (1, 4, 8, 32)) + " |")
    tokens = args.tokens or (256 if device.type == "cuda" else 96)
    if pair is not None and not args.skip_engine:
        engine_speeds(pair, args.compile, tokens)
    elif args.tokenizer and not args.skip_engine:
        engine_overhead(models, args.tokenizer, variants, ms["large"], tokens)


def engine_overhead(
    models: dict[str, torch.nn.Module], tokenizer_dir: str, variants: list[str], step_ms: dict[str, float], tokens: int
) -> None:
    """The engine's loop in mode ``large`` on the random models, per runner, against the raw one-token step measured
    above: what the engine adds per token (sampling, events, spans, stop checks) on this device. Random weights write
    noise, so relay and speculation are not run here (no cue would occur; drafts would never be accepted)."""
    from relaygen_integrations import RelayEngine
    from relaygen_integrations.engine.core.pairs import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    messages = [{"role": "user", "content": "What is 12 times 7? Reason step by step."}]
    runners = {"eager": {}, "static": {"kv_cache": "static"}, "compiled": {"compile": True}}
    print(f"\nEngine loop, mode large, random weights, {tokens} new tokens (fewer if an end-of-text token comes up):\n")
    print("| engine runner | tokens | ms/token | raw step ms | engine overhead |")
    print("|---|---|---|---|---|")
    for runner in variants:
        engine = RelayEngine.from_models(models["large"], None, tokenizer, mode="large", **runners[runner])
        engine.generate(messages, max_new_tokens=16)  # warm-up (and, compiled, the capture)
        result = engine.generate(messages, max_new_tokens=tokens)
        per_token = result.elapsed / max(result.usage.completion_tokens, 1) * 1000
        raw = step_ms[runner]
        print(f"| {runner} | {result.usage.completion_tokens} | {per_token:.2f} | {raw:.2f} | {per_token / raw:.2f}x |")


def engine_speeds(models: dict[str, torch.nn.Module], compile: bool, max_new_tokens: int) -> None:
    """The engine's own loop on a GSM8K question with the demo pair's weights: large / relay / relay-spec (also with
    a 32k draft vocabulary), with the eager DynamicCache runner, the static-cache runner and (``compile``) the
    static-cache runner with compiled one-token steps."""
    from relaygen_integrations import RelayEngine
    from relaygen_integrations.engine.core.pairs import load_tokenizer
    from relaygen_integrations.prompts import load_gsm8k, math_messages
    from relaygen_integrations.registry import pair_paths

    paths = pair_paths("demo", "bf16")
    assert paths is not None
    tokenizer = load_tokenizer(str(paths.large))
    messages = math_messages(load_gsm8k()[0]["question"])
    runners = {"eager": {}, "static": {"kv_cache": "static"}} | ({"compiled": {"compile": True}} if compile else {})
    print(f"\nEngine, {max_new_tokens} new tokens per run:\n")
    print("| engine runner | mode | tokens | tok/s | vs large (same runner) | vs eager large |")
    print("|---|---|---|---|---|---|")
    eager_large = 0.0
    for runner, options in runners.items():
        engine = RelayEngine.from_models(
            models["large"], models["small"], tokenizer, cues="auto", pair_name="demo", **options  # type: ignore[arg-type]
        )  # fmt: skip
        base = 0.0
        modes = {
            "large": {"mode": "large"}, "relay": {}, "relay-spec": {"speculative": True},
            # drafts over the 32k most frequent tokens (+ prompt and special tokens): a cheaper output layer
            "relay-spec@32768": {"speculative": True, "draft_vocab": 32768},
        }  # fmt: skip
        for label, settings in modes.items():
            engine.generate(messages, max_new_tokens=16, **settings)  # warm-up (and, compiled, the compilation)
            result = engine.generate(messages, max_new_tokens=max_new_tokens, **settings)
            rate = result.usage.completion_tokens / result.elapsed
            base = base or rate
            eager_large = eager_large or rate
            print(
                f"| {runner} | {label} | {result.usage.completion_tokens} | {rate:.2f} | {rate / base:.2f}x | "
                f"{rate / eager_large:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
