"""Offline generation: `mmspec generate --prompts FILE --out-dir DIR` writes one image and one stats file per prompt
and seed, by a plain loop in this process or, with workers, by Ray Data with one actor per GPU (or per CPU slot).

A run is resumable and writes nothing twice: image (p, i) (prompt p of the file, image i of `--n`) is
`DIR/{p:06d}-{i}.png`, drawn from the generator seeded `seed + p * n + i` (as `mmspec generate` numbers a batch's
images), and is done once its stats file `DIR/{p:06d}-{i}.json` exists; both are written whole (a temporary file
renamed), the stats last. A restarted run does what is not done, so a run killed at any moment and started again
ends with each image once, whole. `DIR/run.json` records what the run is (model, prompts, seeds, sampling, the
decoding): a restart with other settings is refused rather than mixed in, and `"auto"` is chosen once, at the
start, and recorded, so an image depends on its seed only, not on which call or worker drew it. At the end,
`DIR/stats.jsonl` gathers every image's stats line.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from mmspec.core.files import remove_partial_files, write_atomically
from mmspec.serving.requests import GenerationRequest

RUN_FILE, STATS_FILE = "run.json", "stats.jsonl"


@dataclass(frozen=True)
class Job:
    """Image `image` of prompt `index`: its prompt, its seed and its file's name (without extension)."""

    index: int
    image: int
    prompt: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.index:06d}-{self.image}"


def jobs(prompts: list[str], n: int, seed: int) -> list[Job]:
    return [Job(p, i, prompt, seed + p * n + i) for p, prompt in enumerate(prompts) for i in range(n)]


def pending(out_dir: Path, all_jobs: list[Job]) -> list[Job]:
    """The jobs whose stats file is not written yet."""
    return [job for job in all_jobs if not (out_dir / f"{job.name}.json").is_file()]


def run_record(model: str, prompts: list[str], n: int, seed: int, request: GenerationRequest) -> dict:
    """What a run is: a restart must match it."""
    digest = hashlib.sha256("\n".join(prompts).encode()).hexdigest()
    return {"model": model, "prompts": len(prompts), "prompts_sha256": digest, "n": n, "seed": seed,
            "decoding": request.decoding, "settings": request.settings, "sampling": request.sampling}


def recorded_run(out_dir: Path) -> dict | None:
    """The run recorded in `out_dir`, or None."""
    recorded = out_dir / RUN_FILE
    return json.loads(recorded.read_text()) if recorded.is_file() else None


def check_run(recorded: dict, record: dict) -> None:
    """ValueError naming what differs where `record` is not the run `recorded`."""
    changed = sorted(key for key in {*recorded, *record} if recorded.get(key) != record.get(key))
    if changed:
        raise ValueError(f"it holds a run with other {', '.join(changed)}; resume it with the same arguments, or "
                         "write to another folder")


def start_run(out_dir: Path, record: dict) -> None:
    """Record the run in `out_dir` (made if missing), or check it matches the run already recorded there and remove
    the temporary files of writes a kill cut short."""
    out_dir.mkdir(parents=True, exist_ok=True)
    recorded = recorded_run(out_dir)
    if recorded is not None:
        check_run(recorded, record)
        remove_partial_files(out_dir)
        return
    write_atomically(lambda file: Path(file).write_text(json.dumps(record, indent=1) + "\n"), out_dir / RUN_FILE)


class Writer:
    """Runs jobs through a pipeline, a call of up to `batch_size` images at a time, and writes their files. A Ray Data
    actor (`__call__` on a batch of job columns) or, in a plain loop, `write_jobs`."""

    def __init__(self, model, request: GenerationRequest, out_dir: str):
        from mmspec.serving.models import ServedModel

        self.pipe = model.load() if isinstance(model, ServedModel) else model
        self.request, self.out_dir = request, Path(out_dir)

    def write_jobs(self, batch: list[Job]) -> list[str]:
        """Generate `batch` in one call and write each image, then its stats; the names written."""
        from mmspec.serving.calls import answer_group

        requests = [replace(self.request, prompts=(job.prompt,), n=1, seed=job.seed) for job in batch]
        for job, answer in zip(batch, answer_group(self.pipe, requests), strict=True):
            write_atomically(answer["outputs"][0].save, self.out_dir / f"{job.name}.png")
            line = {"name": job.name, "index": job.index, "image": job.image, "prompt": job.prompt,
                    "seed": job.seed, **answer["stats"]}
            write_atomically(lambda file, line=line: Path(file).write_text(json.dumps(line) + "\n"),
                             self.out_dir / f"{job.name}.json")
        return [job.name for job in batch]

    def __call__(self, columns: dict) -> dict:
        batch = [Job(int(index), int(image), str(prompt), int(seed)) for index, image, prompt, seed in
                 zip(columns["index"], columns["image"], columns["prompt"], columns["seed"], strict=True)]
        return {"name": self.write_jobs(batch)}


def run_locally(writer: Writer, todo: list[Job], batch_size: int, progress) -> None:
    """The jobs in calls of `batch_size` images, in this process."""
    for start in range(0, len(todo), batch_size):
        progress(len(writer.write_jobs(todo[start : start + batch_size])))


def run_on_ray(model, request: GenerationRequest, out_dir: Path, todo: list[Job], batch_size: int, workers: int,
               progress, address: str | None = None) -> None:
    """The jobs through Ray Data on the cluster at `address` (None: a new local one): `workers` actors, each holding
    a GPU (or an equal share where the cluster has fewer) when `model` is on CUDA, a call of `batch_size` images at a
    time each; `progress(k)` as each call's files are written."""
    import ray

    from mmspec.serving.models import connect, gpu_share

    gpus = connect(address)
    ray.data.DataContext.get_current().enable_progress_bars = False  # the command's own bar counts the images
    gpus_per_worker = gpu_share(workers, gpus) if "cuda" in model.device else 0.0
    data = ray.data.from_items([asdict(job) for job in todo], override_num_blocks=max(1, len(todo) // batch_size))
    written = data.map_batches(Writer, fn_constructor_args=(model, request, str(out_dir)), batch_size=batch_size,
                               compute=ray.data.ActorPoolStrategy(size=workers), num_gpus=gpus_per_worker,
                               num_cpus=0 if gpus_per_worker else 1 / workers)
    for batch in written.iter_batches(batch_size=None):
        progress(len(batch["name"]))


def gather_stats(out_dir: Path, all_jobs: list[Job]) -> None:
    """`DIR/stats.jsonl`: every image's stats line, in prompt order."""
    lines = [(out_dir / f"{job.name}.json").read_text() for job in all_jobs]
    write_atomically(lambda file: Path(file).write_text("".join(lines)), out_dir / STATS_FILE)
