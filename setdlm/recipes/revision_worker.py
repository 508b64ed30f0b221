"""One side of ``setdlm bench decode --against REV``: decodes on request, in its own process.

Run as ``python -c <this file's text>`` with the working directory at a checkout of the
revision under test, so that ``import setdlm`` finds that revision's code (the parent checks
``setdlm.__file__``). Deliberately self-contained: standard library, torch, and the two
names every revision since November 2026 has, ``bench_model`` and ``BenchSettings``.

Protocol: one JSON request per line on stdin, one JSON answer per line on stdout.
- {"op": "model", "family", "settings", "weights", "save"}: build the benchmark model; with
  ``save`` write its weights to ``weights``, otherwise load them from there (strictly), so
  both revisions decode with the same numbers even if their random initialisation drifted.
- {"op": "decode", "family", "threshold", "settings"}: one greedy decode of the benchmark's
  prompts; answers wall and forward seconds, NFE, tokens generated and a digest of the tokens.
"""

import dataclasses
import hashlib
import json
import os
import sys

import torch


def _bench_module():
    import setdlm

    # Decide by the files of this revision: an editable install of another checkout would
    # otherwise supply a subpackage this revision lacks.
    package = os.path.dirname(setdlm.__file__)
    if os.path.exists(os.path.join(package, "recipes", "bench.py")):
        from setdlm.recipes import bench
    else:  # the layout before the recipes package
        from setdlm import bench
    if not os.path.abspath(bench.__file__).startswith(os.path.abspath(package)):
        raise SystemExit(f"the benchmark module {bench.__file__} is not under {package}")
    return bench


def _config(bench, family, settings, threshold):
    if hasattr(bench, "bench_decode_config"):
        return bench.bench_decode_config(family, settings, threshold)
    from setdlm.core.decoding import DecodeConfig  # older: the same knobs, spelt out

    return DecodeConfig(
        max_new_tokens=settings.new_tokens,
        confidence_threshold=threshold,
        block_size=settings.mdlm_block if family == "mdlm" else None,
    )


def _prompts(settings):
    generator = torch.Generator().manual_seed(settings.seed + 1)
    shape = (settings.batch_size, settings.prompt_tokens)
    prompts = torch.randint(3, settings.vocab_size - 1, shape, generator=generator)
    prompts[:, 0] = 1  # BOS
    return prompts.tolist()


def main():
    import setdlm

    torch.set_num_threads(int(os.environ.get("SETDLM_BENCH_THREADS", "1")))
    bench = _bench_module()
    models = {}
    print(json.dumps({"ready": True, "setdlm": setdlm.__file__}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        known = {f.name for f in dataclasses.fields(bench.BenchSettings)}
        settings = bench.BenchSettings(
            **{k: v for k, v in request["settings"].items() if k in known}
        )
        family = request["family"]
        if request["op"] == "model":
            model = bench.bench_model(family, settings)
            if request["save"]:
                torch.save(model.state_dict(), request["weights"])
            else:
                model.load_state_dict(torch.load(request["weights"]), strict=True)
            models[family] = model
            print(json.dumps({"ok": True}), flush=True)
            continue
        config = _config(bench, family, settings, request["threshold"])
        with torch.no_grad():
            out = models[family].generate(_prompts(settings), config)
        digest = hashlib.sha256(json.dumps(out.new_token_ids).encode()).hexdigest()[:16]
        answer = {
            "wall": out.wall_seconds,
            "forward": out.forward_seconds,
            "nfe": out.nfe,
            "tokens": sum(out.num_generated),
            "digest": digest,
        }
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":  # python -c sets it too
    main()
