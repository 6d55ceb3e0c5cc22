"""`relaygen serve`: the relay (or, with --single, one model) behind an OpenAI-compatible HTTP API."""

from __future__ import annotations

import argparse
import os
import sys

from .generate import cues_arg

# The relay server's default cap (serve.DEFAULT_MAX_TOKENS_CAP), here so that --help does not import FastAPI.
DEFAULT_MAX_TOKENS_CAP = 4096


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "serve",
        help="serve the relay (or one model with --single) over an OpenAI-compatible HTTP API",
        description="Relay mode: POST /v1/chat/completions (JSON or SSE) and GET /v1/models, with spans and per-model "
        "token counts in every response. --single: one model as a plain POST /v1/completions server (token-id or "
        "text prompts, vLLM-style stop_reason and return_token_ids), the counterpart of "
        "RelayEngine.from_endpoints.",
    )
    parser.add_argument("--large", default="demo", help="known pair name, hub id or local dir (default: demo)")
    parser.add_argument("--small", default="demo", help="known pair name, hub id or local dir (default: demo)")
    parser.add_argument("--cues", default="auto", help="auto | qwen3 | r1 | generic | none | comma list | profile.json")
    parser.add_argument("--single", action="store_true", help="serve one model (--model) as a completion server")
    parser.add_argument("--model", default=None, help="with --single: pair role (demo:small), hub id or local dir")
    parser.add_argument(
        "--dtype",
        default="auto",
        help="auto (the pair's shipped formats, else bf16) | fast (int8 on a CPU, bf16 on CUDA) | bf16 | fp32 | int8 "
        "| gguf (CPU: the GGUF's own 4-bit weights)"
        " (CPU); LARGE/SMALL gives each model its own (e.g. bf16/int8; --single: one format)",
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="compile the one-token decode steps (static KV cache; GPU: CUDA graphs)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--api-key",
        default=os.environ.get("RELAYGEN_API_KEY"),
        help="require 'Authorization: Bearer KEY' (default: $RELAYGEN_API_KEY, else no key)",
    )
    parser.add_argument("--served-model-name", default=None, help="the model id clients send and /v1/models lists")
    parser.add_argument(
        "--max-tokens-cap",
        type=int,
        default=DEFAULT_MAX_TOKENS_CAP,
        metavar="N",
        help=f"relay mode: refuse requests for more than N new tokens (default: {DEFAULT_MAX_TOKENS_CAP}); --single "
        "is bounded by the model's context window",
    )
    parser.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    if args.single and not args.model:
        print("relaygen serve: --single needs --model (e.g. --model demo:small or a hub id)", file=sys.stderr)
        return 2
    if not 0 < args.port < 65536:
        print(f"relaygen serve: --port must be 1..65535, got {args.port}", file=sys.stderr)
        return 2
    if args.max_tokens_cap < 1:
        print(f"relaygen serve: --max-tokens-cap must be a positive number, got {args.max_tokens_cap}", file=sys.stderr)
        return 2
    try:
        # FastAPI, uvicorn, torch and transformers load only when a server really starts.
        from ..serve.app import create_app
        from ..serve.http import LOOPBACK_HOSTS, run_server
        from ..serve.single import create_single_app
    except ImportError as exc:
        raise RuntimeError(f"relaygen serve needs: pip install 'relaygen-integrations[serve]' ({exc})") from exc
    from ..engine import RelayEngine
    from ..engine.local.kv import cache_options
    from ..engine.local.loading import load_model

    if args.host not in LOOPBACK_HOSTS and not args.api_key:
        print(f"relaygen serve: warning: listening on {args.host} without --api-key", file=sys.stderr)
    if args.single:
        model, tokenizer = load_model(args.model, args.device, args.dtype)
        name = args.served_model_name or args.model
        app = create_single_app(
            model, tokenizer, served_model_name=name, api_key=args.api_key,
            cache=cache_options(compile=args.compile),
        )  # fmt: skip
    else:
        engine = RelayEngine.from_pretrained(
            args.large, args.small, cues=cues_arg(args.cues), device=args.device, dtype=args.dtype,
            compile=args.compile,
        )  # fmt: skip
        name = args.served_model_name or "relaygen"
        app = create_app(engine, served_model_name=name, api_key=args.api_key, max_tokens_cap=args.max_tokens_cap)
    run_server(app, args.host, args.port)
    return 0
