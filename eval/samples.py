"""Generated samples for the evaluation scripts: decoding-method specs, prompt files, and a resumable image store.

The store keeps one PNG per (method, seed set, prompt, image) under `<root>/<method label>/set<s>/`, with the decoding
stats of the call that made it in the PNG's text chunk, so a run that stops can be resumed (existing images are
skipped) and speed can be summarised from what is on disk. `<root>/<label>/method.json` pins what the label means
(decoding options, sampling settings, seeds): reusing a label for something else is an error, never a silent mix.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image, PngImagePlugin
from tqdm.auto import tqdm

from mmspec.core.component import setting_keywords
from mmspec.core.registry import decodings, rules
from mmspec.eval.bench_image import BEST
from mmspec.eval.devices import seeded
from mmspec.image import get_decoding

# settings tuned on the embedded model over the registered defaults: our best exact SJD (mmspec.eval.bench_image
# --sweep), which every lossy rule's preset runs on, and LANTERN at k = 100, delta = 0.1
TUNED = {"sjd": BEST["sjd_maximal"], "lantern": {"lantern_k": 100, "lantern_delta": 0.1}}
SEEDS_PER_SET = 1_000_000  # seed of image k of prompt i in seed set s: base + s * SEEDS_PER_SET + i * K + k


def _value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def presets() -> dict[str, dict]:
    """The methods `--methods` names: every registered image decoding (`ar`, `sjd`, `draft`, `pjd`, yours; tuned
    where `TUNED` says), every registered lossy rule on the best exact SJD (`lantern`, `gsd`), and `tree`, SJD-PAC's
    frontier tree on the maximal coupling."""
    methods = {name: TUNED.get(name, {"decoding": name}) for name in decodings("image")}
    relaxed = {name: {**TUNED["sjd"], "acceptance": name, **TUNED.get(name, {})}
               for name, rule in rules("image").items() if not rule.lossless}
    return {**methods, **relaxed, "tree": BEST["sjd_tree"]}


@dataclass(frozen=True)
class Method:
    """A decoding method to evaluate: a label and the pipeline options that select it."""

    label: str
    options: dict = field(hash=False)

    @classmethod
    def parse(cls, text: str) -> Method:
        """`[label=]preset[:key=value,...]`: a preset (`presets()`: a registered decoding, a lossy rule, `tree`)
        whose pipeline options the pairs set or override, e.g. `d02=lantern:lantern_delta=0.2` or
        `wide=sjd:window=24,coupling=gumbel`. The label defaults to the preset's name, or to `text` with pairs."""
        head, _, pairs = text.partition(":")
        label, _, name = head.rpartition("=")
        known = presets()
        if name not in known:
            raise ValueError(f"methods: unknown preset {name!r} in {text!r}; use one of {list(known)}")
        options, keys = dict(known[name]), setting_keywords("image")
        for pair in filter(None, pairs.split(",")):
            key, sep, value = pair.partition("=")
            if not sep or key not in keys:
                raise ValueError(f"methods: bad option {pair!r} in {text!r}; options are key=value with key in "
                                 f"{list(keys)}")
            options[key] = _value(value)
        return cls(label or (re.sub(r"[^\w.+-]", "_", text) if pairs else name), options)

    @property
    def is_ar(self) -> bool:
        return self.options["decoding"] == "ar"

    @property
    def lossless(self) -> bool:
        return get_decoding(**self.options).lossless


@dataclass(frozen=True)
class Sample:
    """One image to make: image `image_index` of prompt `prompt_index` in seed set `seed_set` of a method."""

    method: Method
    seed_set: int
    prompt_index: int
    image_index: int
    prompt: str
    seed: int
    path: Path


class SampleStore:
    """The images of every (method, seed set) for `prompts`, `images_per_prompt` each, under `root`."""

    def __init__(self, root: str | Path, prompts: list[str], images_per_prompt: int, base_seed: int, sampling: dict):
        self.root, self.prompts, self.images_per_prompt = Path(root), prompts, images_per_prompt
        self.base_seed, self.sampling = base_seed, sampling

    def samples(self, method: Method, seed_set: int) -> list[Sample]:
        folder = self.root / method.label / f"set{seed_set}"
        k = self.images_per_prompt
        return [Sample(method, seed_set, i, j, prompt, self.base_seed + seed_set * SEEDS_PER_SET + i * k + j,
                       folder / f"{i:05d}-{j}.png") for i, prompt in enumerate(self.prompts) for j in range(k)]

    def claim(self, method: Method, model: str) -> None:
        """Pin what `method.label` means in this store (first use), or check that it still means that."""
        spec = {"options": method.options, "model": model, "sampling": self.sampling, "base_seed": self.base_seed,
                "images_per_prompt": self.images_per_prompt}
        path = self.root / method.label / "method.json"
        if path.exists():
            stored = json.loads(path.read_text())
            if stored != json.loads(json.dumps(spec)):
                raise ValueError(f"out_dir: {str(path.parent)!r} holds images of another setting ({stored}), not "
                                 f"{spec}; use another --out-dir or another label")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(spec, indent=1) + "\n")

    def pending(self, method: Method, seed_set: int) -> list[Sample]:
        return [s for s in self.samples(method, seed_set) if not s.path.exists()]

    @staticmethod
    def write(sample: Sample, image: Image.Image, record: dict) -> None:
        info = PngImagePlugin.PngInfo()
        info.add_text("mmspec", json.dumps({"prompt": sample.prompt, "seed": sample.seed, **record}))
        sample.path.parent.mkdir(parents=True, exist_ok=True)
        partial = sample.path.with_suffix(".partial")
        image.save(partial, format="PNG", pnginfo=info)
        os.replace(partial, sample.path)  # a run killed mid-write leaves no truncated PNG to be taken as done

    def read(self, method: Method, seed_set: int) -> tuple[np.ndarray, list[dict]]:
        """(uint8 images [N, H, W, 3], their records) of a complete (method, seed set); raises if any is missing or
        was made for another prompt or seed."""
        samples = self.samples(method, seed_set)
        missing = [str(s.path) for s in samples if not s.path.exists()]
        if missing:
            raise ValueError(f"out_dir: {len(missing)} images of {method.label} set {seed_set} are missing "
                             f"(first: {missing[0]}); run the generation again to complete it")
        images, records = [], []
        for s in samples:
            with Image.open(s.path) as image:
                record = json.loads(image.text["mmspec"])
                images.append(np.asarray(image.convert("RGB")))
            if (record["prompt"], record["seed"]) != (s.prompt, s.seed):
                raise ValueError(f"out_dir: {s.path} was made for {record['prompt']!r} seed {record['seed']}, not "
                                 f"{s.prompt!r} seed {s.seed}")
            records.append(record)
        return np.stack(images), records


def weights_digest(pipe) -> str:
    """A short digest of a pipeline's weights: every parameter's name, shape, first 1,024 values and sum."""
    digest = hashlib.sha256()
    for name, component in sorted(pipe.components.items()):
        if isinstance(component, torch.nn.Module):
            for key, tensor in component.state_dict().items():
                values = tensor.detach().flatten()
                digest.update(f"{name}.{key}{tuple(tensor.shape)}".encode())
                digest.update(values[:1024].double().cpu().numpy().tobytes())
                digest.update(values.double().sum().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def generate(pipe, store: SampleStore, plan: list[tuple[Method, int]], batch_size: int, model: str,
             process_index: int = 0, num_processes: int = 1) -> int:
    """Make the missing images of every (method, seed set) in `plan` with a LlamaGenPipeline-like `pipe` (`__call__`
    with `output_type="latent"`, `decode_tokens`), `batch_size` rows per call, whole batches dealt round-robin to
    processes. Each row has its own generator, so an image's tokens (kept in its record as `token_ids`) do not depend
    on its batch or process; decoded in a batch of another size or with another thread count, a pixel may round
    differently by one grey level. Each method gets an untimed warm-up call first. Returns how many images this
    process made."""
    model = f"{model} (weights {weights_digest(pipe)})"  # a retrained model's images are another setting
    for method, _ in plan:
        store.claim(method, model)
    work = []
    for method, seed_set in plan:
        pending = store.pending(method, seed_set)
        work += [pending[i : i + batch_size] for i in range(0, len(pending), batch_size)]
    mine = work[process_index::num_processes]
    warmed, made = set(), 0
    for batch in tqdm(mine, desc=f"generate (process {process_index})", disable=not mine):
        method = batch[0].method
        if method.label not in warmed:
            pipe([batch[0].prompt], output_type="latent", **store.sampling, **method.options)
            warmed.add(method.label)
        generators = seeded(pipe.device, [s.seed for s in batch])
        began = time.perf_counter()
        out = pipe([s.prompt for s in batch], generator=generators, output_type="latent", **store.sampling,
                   **method.options)
        images = pipe.decode_tokens(out.images)
        seconds = time.perf_counter() - began
        stats = out.stats
        batch_record = {"batch_id": uuid.uuid4().hex[:12], "batch_size": len(batch), "batch_seconds": seconds,
                        "batch_target_forwards": stats.target_forwards, "excess_acceptance": stats.excess_acceptance}
        for row, (sample, image) in enumerate(zip(batch, images, strict=True)):
            record = {**batch_record, "tokens": int(stats.new_tokens[row]),
                      "forwards": int(stats.steps[row]) + stats.prefill_forwards,
                      "token_ids": " ".join(map(str, out.images[row].tolist()))}
            store.write(sample, image, record)
        made += len(batch)
    return made


def speed_summary(records: list[dict]) -> dict:
    """Speed of a method from its images' records: median seconds and mean target forwards per pipeline call,
    step compression (tokens per target forward a row took part in, prefill included), batch sizes seen."""
    batches = {r["batch_id"]: r for r in records}.values()
    excess = [b["excess_acceptance"] for b in batches if b["excess_acceptance"] is not None]
    return {
        "calls": len(batches),
        "batch_sizes": sorted({b["batch_size"] for b in batches}),
        "median_latency_s": statistics.median(b["batch_seconds"] for b in batches),
        "target_forwards_per_call": statistics.fmean(b["batch_target_forwards"] for b in batches),
        "step_compression": sum(r["tokens"] for r in records) / sum(r["forwards"] for r in records),
        **({"excess_acceptance": statistics.fmean(excess)} if excess else {}),
    }
