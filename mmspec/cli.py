"""The `mmspec` command.

    mmspec text "def fibonacci(n):" --method model|ngram|layerskip|ar [--max-new-tokens 64 --temperature 0 ...]
    mmspec generate "a red circle above a blue square on a striped background" --out out.png [--n 4 --seed 0 ...]
    mmspec generate "..." --decoding sjd --window 8 --acceptance lantern --lantern-delta 0.2
    mmspec video --actions 'right*6' 'down*4' 'stay*2' --frames 4 --out rollout.gif [--adaptive --context pipelined]
    mmspec demo [--port 7860 --only image|text|world ...]
    mmspec generate --prompts prompts.txt --out-dir images/ [--n 4 --workers 2 --address auto ...]  # resumable
    mmspec serve [--model shapes --model pycode/target --replicas 2 --max-batch-size 8 --port 8000 ...]

A thin front end: argument parsing and checking, then calls into the library (`mmspec.pipelines`, `mmspec.apps`). It
answers `--help` and refuses bad arguments before anything heavy is imported: torch, the models and Gradio load only
once every argument has passed (one line on stderr, exit status 2, nothing written otherwise). The decoding flags are
not written here: they are generated from the registered decodings' and rules' settings (`mmspec.core.registry`, whose
components load without torch), so a method or rule you register gets its flags, checks and help too. It sits at the
top of the package graph (tests/test_layering.py): nothing imports it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import replace
from importlib import metadata
from pathlib import Path

from mmspec.core.component import DecodingComponent, component_from, rule_settings
from mmspec.core.files import read_prompts, write_atomically
from mmspec.core.registry import decodings, load_plugins, rules
from mmspec.core.runtime.devices import add_device_arguments, parse_device  # no torch until a device is asked
from mmspec.core.settings import Spec, defaults, specs
from mmspec.image import methods as image_methods  # noqa: F401  the image decodings (no torch)
from mmspec.pipelines.auto import add_image_model_arguments  # argparse only: the pipelines load on first use
from mmspec.serving.models import DEFAULT_MODELS  # no torch
from mmspec.text.methods import auto_settings, described, method_names, uses_draft_model
from mmspec.video.methods import FrameSpeculation
from mmspec.zoo import TEXT_DRAFT, TEXT_TARGET, VIDEO_WORLD, resolve_model

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp")  # what `mmspec generate --out` writes
VIDEO_EXTENSIONS = (".gif", ".mp4")  # what `mmspec video --out` writes; mp4 needs the [video] extra
DEMO_TABS = ("image", "text", "world")  # mmspec.apps.tabs.TABS, which imports Gradio (a test keeps them equal)
VIDEO_EXTRA = 'pip install "mmspec[video]" (from a clone: pip install -e ".[video]")'
APP_EXTRA = 'pip install "mmspec[app]" (from a clone: pip install -e ".[app]")'
SERVE_EXTRA = 'pip install "mmspec[serve]" (from a clone: pip install -e ".[serve]")'
MAX_QUOTE = 60  # characters of a user's input quoted in an error
MAX_STEPS = 1000  # Euler steps per frame `mmspec video` takes (the zoo world is trained for 4; 1,000 is already slow)
# pipeline arguments whose names reach an error message, as the flags users typed
FLAGS = {"num_images_per_prompt": "--n", "guidance_scale": "--guidance-scale", "negative_prompt": "--negative-prompt",
         "max_new_tokens": "--max-new-tokens", "top_k": "--top-k", "top_p": "--top-p", "temperature": "--temperature",
         "num_inference_steps": "--steps", "drafter": "--method", "cfg_interval": "--cfg-interval"}


class UsageError(ValueError):
    """A command-line argument that cannot work; the message starts with the flag."""


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `mmspec generate: error: ...` and exit status 2, no usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def quoted(text: str, limit: int = MAX_QUOTE) -> str:
    """`text` as repr, cut to `limit` characters with its length noted when longer."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text):,} characters)"


def flag(name: str) -> str:
    """The flag of a setting or argument: `tree_depth` -> `--tree-depth`."""
    return FLAGS.get(name, "--" + name.replace("_", "-"))


def in_flag_terms(message: str, names: tuple[str, ...] = ()) -> str:
    """A library error as the CLI user sees it: pipeline argument and decoding setting names (`names`) as flags
    (`name='value'` as `--flag value`; a plain word such as `window` only where it opens the message or a clause, the
    prose keeps it), and at most one line of 400 characters (an error that echoes a long input never floods the
    terminal)."""
    for name in sorted({*FLAGS, *names}, key=len, reverse=True):
        message = re.sub(rf"\b{name}=(['\"]?)([^'\", ;)]+)\1", rf"{flag(name)} \2", message)
        where = rf"(?<![-\w]){name}\b" if "_" in name else rf"(?:(?<=^)|(?<=; )){name}\b"
        message = re.sub(where, flag(name), message)
    line = " ".join(message.split())
    return line if len(line) <= 400 else line[:400] + "..."


# --- checks: every one runs before a model loads ------------------------------------------------------------------
def check_device(args) -> None:
    """--device names a device this machine has (the last check, before any model loads)."""
    try:
        args.device = parse_device(args.device)
    except ValueError as error:
        raise UsageError(str(error)) from None


def check_prompts(prompts: list[str]) -> None:
    for i, prompt in enumerate(prompts):
        if not prompt.strip():
            where = "" if len(prompts) == 1 else f" {i + 1} of {len(prompts)}"
            raise UsageError(f"prompt{where} is empty: say what to generate")


def check_number(args, flag: str, low: float | None = None, high: float | None = None,
                 low_open: bool = False) -> None:
    """`--flag` (None = not given) within [low, high] ((low, high] when `low_open`), checked as a setting's range is."""
    value = getattr(args, flag.lstrip("-").replace("-", "_"))
    if value is not None:
        Spec("", type(value), low=low, high=high, low_open=low_open).check(flag, value)


def check_output(path: str, extensions: tuple[str, ...], flag: str = "--out") -> None:
    """`path` can be written: a known extension, an existing writable folder, not itself a folder."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{flag} {quoted(path)} is a folder; name a file")
    if target.suffix.lower() not in extensions:
        raise UsageError(f"{flag} {quoted(path)}: the file type is unknown; use one of {', '.join(extensions)}")
    folder = target.parent
    if not folder.is_dir():
        raise UsageError(f"{flag} {quoted(path)}: the folder {quoted(str(folder))} does not exist")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise UsageError(f"{flag} {quoted(path)}: no permission to write there")
    try:  # what the permission bits cannot tell (/proc, a read-only mount): a file made there and removed at once
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise UsageError(f"{flag} {quoted(path)}: files cannot be written there ({error.strerror})") from None


def check_model(name: str, flag: str) -> None:
    try:
        resolve_model(name, argument=flag)
    except ValueError as error:
        raise UsageError(str(error).replace(repr(name), quoted(name))) from None


# --- decoding flags: generated from the registered decodings' and rules' settings ----------------------------------
def decoding_fields(modality: str) -> dict[str, dict[str, tuple[Spec, object]]]:
    """setting -> {decoding name: (its spec, its default)} over the registered decodings of `modality`."""
    fields: dict[str, dict[str, tuple[Spec, object]]] = {}
    for name, cls in decodings(modality).items():
        for field, spec in specs(cls).items():
            fields.setdefault(field, {})[name] = (spec, defaults(cls)[field])
    return fields


def rule_fields(modality: str) -> dict[str, tuple[str, Spec, object]]:
    """The rules' flat spellings (`lantern_delta`) -> (rule name, spec, default)."""
    found = {}
    for flat, (rule, field) in rule_settings(modality).items():
        cls = rules(modality)[rule]
        found[flat] = (rule, specs(cls)[field], defaults(cls)[field])
    return found


def add_setting(parser, name: str, owners: dict[str, tuple[Spec, object]], owner_word: str) -> None:
    """A flag for setting `name`, typed from its spec; the help says what it does for each owner (the owners that
    share a help and a default once)."""
    spec = next(iter(owners.values()))[0]
    grouped: dict[tuple[str, object], list[str]] = {}
    for owner, (own, default) in owners.items():
        grouped.setdefault((own.help, default), []).append(owner)
    helps = [f"{owner_word}{' / '.join(names)}: {text}" + (f" (default {default})" if default is not None else "")
             for (text, default), names in grouped.items()]
    kwargs = {"default": None, "help": "; ".join(helps).replace("%", "%%")}
    if spec.kind is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    else:
        kwargs["type"] = float if spec.kind is tuple else spec.kind
        if spec.kind is tuple:
            kwargs["nargs"] = "+"
        choices = [c for own, _ in owners.values() for c in own.choices or ()]
        if choices:
            kwargs["choices"] = tuple(dict.fromkeys(choices))
    parser.add_argument(flag(name), **kwargs)


def add_decoding_arguments(parser, modality: str, owner_word: str) -> None:
    """Every registered `modality` decoding's settings as flags (`--window`), `--acceptance` and the rules' settings
    (`--lantern-delta`)."""
    for name, owners in decoding_fields(modality).items():
        add_setting(parser, name, owners, owner_word)
    lossless = [name for name, rule in rules(modality).items() if rule.lossless]
    parser.add_argument("--acceptance", choices=tuple(rules(modality)), default=None,
                        help=f"the acceptance rule ({', '.join(lossless)}: lossless, the others lossy and report "
                             "their realised distortion)")
    for flat, (rule, spec, default) in rule_fields(modality).items():
        add_setting(parser, flat, {rule: (spec, default)}, "--acceptance ")


def given_settings(args, modality: str) -> tuple[dict, dict]:
    """(the decoding settings the user gave, the rules' flat settings the user gave), range-checked as flags."""
    settings = {name: getattr(args, name) for name in decoding_fields(modality) if getattr(args, name) is not None}
    flats = {name: getattr(args, name) for name in rule_fields(modality) if getattr(args, name) is not None}
    for name, value in settings.items():
        next(iter(decoding_fields(modality)[name].values()))[0].check(flag(name), value)
    for name, value in flats.items():
        rule_fields(modality)[name][1].check(flag(name), value)
    for name in flats:
        rule = rule_fields(modality)[name][0]
        if args.acceptance != rule:
            raise UsageError(f"{flag(name)} applies to --acceptance {rule} only")
    return settings, flats


def built(modality: str, name: str, settings: dict, temperature: float, names: tuple[str, ...]) -> DecodingComponent:
    """The decoding the flags describe, built and checked as the pipeline will (what it can check alone, before
    any model loads); its errors in flag terms."""
    try:
        decoding = component_from(name, modality, **settings)
        decoding.check_sampling(temperature)
    except (TypeError, ValueError) as error:
        raise UsageError(in_flag_terms(str(error), names)) from None
    return decoding


def check_image_decoding(args) -> DecodingComponent | None:
    """The image decoding of `mmspec generate`'s flags; None for `--decoding auto`, which takes no setting."""
    fields = decoding_fields("image")
    settings, flats = given_settings(args, "image")
    for name in settings:
        if args.decoding not in fields[name]:
            raise UsageError(f"{flag(name)} applies to --decoding {' / '.join(fields[name])} only")
    takers = [name for name, cls in decodings("image").items() if "acceptance" in cls.settings()]
    if args.acceptance is not None and args.decoding not in takers:
        raise UsageError(f"--acceptance applies to --decoding {' / '.join(takers)} only")
    if args.decoding == "auto":
        return None
    return built("image", args.decoding, {**settings, "acceptance": args.acceptance, **flats}, args.temperature,
                 (*fields, *rule_fields("image"), "acceptance"))


def check_text_decoding(args) -> dict:
    """The settings of `mmspec text`'s flags, for its `--method`: a registered text decoding by name (a drafter's,
    "heads"), "ar", or "auto" (the settings narrow its candidates to the drafters that read them)."""
    settings, flats = given_settings(args, "text")
    fields, auto_reads = decoding_fields("text"), auto_settings()
    for name in settings:
        if args.method not in fields[name] and (args.method != "auto" or name not in auto_reads):
            auto = " (or auto)" if name in auto_reads else ""
            raise UsageError(f"{flag(name)} applies to --method {' / '.join(fields[name])}{auto} only")
    if args.acceptance is not None and args.method == "ar":
        raise UsageError("--acceptance applies to a drafter's --method (or auto) only")
    if args.method == "auto" and args.acceptance not in (None, "exact"):
        raise UsageError(f"--acceptance {args.acceptance} needs a named --method (auto chooses among the exact ones)")
    settings = {**settings, "acceptance": args.acceptance, **flats}
    if args.method not in ("auto", "ar"):
        built("text", args.method, settings, args.temperature, (*fields, *rule_fields("text"), "acceptance"))
    return settings


def check_text(args) -> None:
    check_prompts(args.prompt)
    for flag_name, low in (("--max-new-tokens", 1), ("--top-k", 0), ("--seed", 0), ("--temperature", 0)):
        check_number(args, flag_name, low)
    check_number(args, "--top-p", 0, 1, low_open=True)
    args.settings = check_text_decoding(args)
    if args.online_every is not None:
        check_number(args, "--online-every", 1)
        if args.method == "auto" or not (uses_draft_model(args.method) or args.method == "heads"):
            learners = [name for name in method_names() if uses_draft_model(name)]
            raise UsageError(f"--online-every: the draft LM learns online under --method {', '.join(learners)}, "
                             f"the --kind head under --method heads; not {args.method}")
    check_model(args.target, "--target")
    if uses_draft_model(args.method):
        check_model(args.draft, "--draft")
    check_text_lengths(args.prompt, args.max_new_tokens, resolve_model(args.target, argument="--target"))


def check_text_lengths(prompts: list[str], max_new_tokens: int, target) -> None:
    """Every prompt and its new tokens fit the target's context (`max_position_embeddings`), counted by the target's
    own tokenizer file before any model loads (a folder of the target; a hub id is checked by the loaded model)."""
    folder = Path(target)
    config, tokenizer_file = folder / "config.json", folder / "tokenizer.json"
    if not (config.is_file() and tokenizer_file.is_file()):
        return
    context = json.loads(config.read_text()).get("max_position_embeddings")
    if context is None:
        return
    if max_new_tokens >= context:
        raise UsageError(f"--max-new-tokens {max_new_tokens}: the target's context holds {context} positions, "
                         "the prompt's included")
    from tokenizers import Tokenizer  # a Rust tokenizer: no torch, a fraction of a second

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    for prompt, encoding in zip(prompts, tokenizer.encode_batch(prompts), strict=True):
        if len(encoding.ids) + max_new_tokens > context:
            raise UsageError(f"prompt {quoted(prompt)} is {len(encoding.ids)} tokens long; with --max-new-tokens "
                             f"{max_new_tokens} that is more than the {context} positions the target's context holds")


def check_generate(args) -> None:
    if args.prompts is None:
        if not args.prompt:
            raise UsageError("say what to generate: one or more prompts, or --prompts FILE --out-dir DIR")
        check_prompts(args.prompt)
        for name in ("--out-dir", "--workers", "--address", "--batch-size"):
            if getattr(args, name.lstrip("-").replace("-", "_")) is not None:
                raise UsageError(f"{name} applies to a run from a prompt file (--prompts FILE --out-dir DIR) only")
    else:
        check_prompt_file(args)
    for flag_name, low in (("--n", 1), ("--seed", 0), ("--guidance-scale", 0), ("--temperature", 0), ("--top-k", 0),
                           ("--height", 1), ("--width", 1), ("--upscale", 1), ("--cfg-interval", -1)):
        check_number(args, flag_name, low)
    check_number(args, "--top-p", 0, 1, low_open=True)
    args.component = check_image_decoding(args)
    if args.prompts is None:
        check_output(args.out, IMAGE_EXTENSIONS)
    check_model(args.model, "--model")
    if args.vqgan is not None and not Path(args.vqgan).is_file():
        raise UsageError(f"--vqgan {quoted(args.vqgan)}: no such file")
    at_once = len(args.prompt) * args.n if args.prompts is None else args.batch_size
    check_batch_fits(at_once, resolve_model(args.model, argument="--model"))
    if args.prompts is not None:
        check_resumed_run(args)


def check_resumed_run(args) -> None:
    """`args.run`: the offline run's request, with the decoding a resumed run recorded when "auto" names none; a
    folder holding a run of other settings refused."""
    from mmspec.serving import offline
    from mmspec.serving.requests import GenerationRequest

    sampling = {key: value for key, value in image_sampling(args).items() if value is not None}
    decoding = args.component.to_config() if args.component is not None else args.decoding
    recorded = offline.recorded_run(Path(args.out_dir))
    if decoding == "auto" and recorded is not None:  # a resumed run keeps what "auto" chose at its start
        decoding = recorded["decoding"]
    args.run = GenerationRequest("image", (), 1, 0, decoding, {}, sampling)
    if recorded is not None:
        try:
            offline.check_run(recorded, offline.run_record(args.model, args.prompt, args.n, args.seed, args.run))
        except ValueError as error:
            raise UsageError(f"--out-dir {quoted(args.out_dir)}: {error}") from None


def check_prompt_file(args) -> None:
    """`--prompts FILE --out-dir DIR`: a file of prompts, a folder that can be written, the run's settings."""
    if args.prompt:
        raise UsageError("give prompts as arguments or as --prompts FILE, not both")
    if args.out_dir is None:
        raise UsageError("--prompts FILE writes one image per prompt and seed into --out-dir DIR: name the folder")
    if not Path(args.prompts).is_file():
        raise UsageError(f"--prompts {quoted(args.prompts)}: no such file")
    try:
        args.prompt = read_prompts(args.prompts, "--prompts")
    except UnicodeDecodeError as error:
        raise UsageError(f"--prompts {quoted(args.prompts)}: not a UTF-8 text file ({error.reason})") from None
    except (KeyError, ValueError) as error:  # JSON that is not a prompt list: a JSONDecodeError is a ValueError
        raise UsageError(f"--prompts {quoted(args.prompts)}: {error}") from None
    if args.upscale != 1:
        raise UsageError("--upscale applies to --out only")
    args.workers = 1 if args.workers is None else args.workers
    args.batch_size = 8 if args.batch_size is None else args.batch_size
    check_number(args, "--workers", 1)
    check_number(args, "--batch-size", 1)
    if args.workers > 1 or args.address is not None:
        check_ray("--workers / --address")
    check_folder(args.out_dir, "--out-dir")


def check_folder(path: str, flag: str) -> None:
    """`path` is a folder that can be written, or one that can be made (its parent exists and can be written)."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{flag} {quoted(path)} is a file; name a folder")
    parent = folder if folder.is_dir() else folder.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {quoted(path)}: the folder {quoted(str(parent))} does not exist")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{flag} {quoted(path)}: no permission to write there")


def check_serve(args) -> None:
    from mmspec.serving.models import served_model  # no torch

    check_address(args)
    for flag_name, low in (("--replicas", 1), ("--max-batch-size", 1), ("--batch-wait-ms", 0),
                           ("--request-timeout-s", 0.001)):
        check_number(args, flag_name, low)
    models = args.model or list(DEFAULT_MODELS)
    args.served = []
    for name in models:
        try:
            args.served.append(served_model(name, args.draft if name == models[-1] else None))
        except ValueError as error:
            raise UsageError(str(error).replace(repr(name), quoted(name))) from None
    ids = [model.id for model in args.served]
    if len(set(ids)) < len(ids):
        raise UsageError(f"--model: two models would be served as one id ({ids})")
    check_ray("mmspec serve")
    if args.address is None:  # on a cluster the proxies listen on its nodes
        check_port_free(args.host, args.port)


def check_batch_fits(images: int, model) -> None:
    """`images` images' KV caches (with their CFG twins) fit half the memory this machine has free, for a saved
    LlamaGen-layout pipeline (its transformer's config read, no weights); other folders are checked as they load."""
    config_file = Path(model) / "transformer" / "config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    if not {"n_layer", "dim", "cls_token_num", "grid_size"} <= set(config):
        return
    slots = config["cls_token_num"] + config["grid_size"] ** 2 + 32  # the condition, the image, a window's headroom
    per_image = 2 * 2 * config["n_layer"] * slots * config["dim"] * 4  # (k, v) x (image, CFG twin), float32
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if images * per_image > free / 2:
        raise UsageError(f"--n: {images:,} images need about {images * per_image / 2**30:,.1f} GiB of KV cache; this "
                         f"machine has {free / 2**30:.1f} GiB free (at most {int(free / 2 / per_image):,} images at "
                         "once)")


def parse_actions(words: list[str], names: tuple[str, ...]) -> list[int]:
    """Action words -> ids: a name ("right") or id ("4"), optionally repeated ("right*6")."""
    actions = []
    for word in words:
        name, _, repeat = word.partition("*")
        if name not in names and not (name.isdigit() and int(name) < len(names)):
            raise UsageError(f"--actions: {quoted(word)} is not one of {names} or an id below {len(names)} "
                             "(optionally followed by *count)")
        if repeat and not (repeat.isdigit() and int(repeat) >= 1):
            raise UsageError(f"--actions: the count in {quoted(word)} must be an integer >= 1")
        actions += [names.index(name) if name in names else int(name)] * (int(repeat) if repeat else 1)
    return actions


def check_video(args) -> None:
    from mmspec.zoo.video_world import ACTIONS  # numpy and Pillow, no torch

    frames = len(parse_actions(args.actions, ACTIONS))
    settings, _ = given_settings(args, "video")
    if args.decoding == "ar" and settings:
        raise UsageError(f"{', '.join(map(flag, settings))} applies to --decoding speculative only")
    check_number(args, "--steps", 1, MAX_STEPS)
    for name in ("--fps", "--upscale"):
        check_number(args, name, 1)
    # frames past the rollout's end would be computed and thrown away: at most the rollout's, by default
    settings.setdefault("frames", min(defaults(FrameSpeculation)["frames"], frames))
    if settings["frames"] > frames:
        raise UsageError(f"--frames {settings['frames']}: more frames than the rollout's {frames} (--actions)")
    args.component = None if args.decoding == "ar" else built("video", args.decoding, settings, 1.0, ())
    check_number(args, "--episode", 0)
    check_number(args, "--seed", 0)
    check_output(args.out, VIDEO_EXTENSIONS)
    if Path(args.out).suffix.lower() == ".mp4" and not all(
            importlib.util.find_spec(module) for module in ("imageio", "imageio_ffmpeg")):
        raise UsageError(f"--out {quoted(args.out)}: writing .mp4 needs the [video] extra: {VIDEO_EXTRA}; or write "
                         ".gif")
    if args.image is not None and not Path(args.image).is_file():
        raise UsageError(f"--image {quoted(args.image)}: no such file")
    check_model(args.model, "--model")


def check_address(args) -> None:
    """--port a port, --host an address or a host name."""
    check_number(args, "--port", 1, 65535)
    if not re.fullmatch(r"[\w.:-]+", args.host):
        raise UsageError(f"--host {quoted(args.host)}: not an address (127.0.0.1, 0.0.0.0 = every interface, ::1) "
                         "or a host name")


def check_port_free(host: str, port: int) -> None:
    """Bind host:port and let it go: a port in use fails before any model loads. For `mmspec serve` it would not fail
    at all: Ray Serve's proxy binds with SO_REUSEPORT, so a second service would share the port with the first, which
    would answer some of its requests."""
    import errno
    import socket

    try:
        family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror:
        raise UsageError(f"--host {quoted(host)}: this machine cannot resolve it") from None
    with socket.socket(family, kind, protocol) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port a stopped service left in TIME_WAIT
        try:
            probe.bind(address)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise UsageError(f"--port {port}: something already serves on {host}:{port} (an earlier instance "
                                 "still running?); stop it or choose another port") from None
            raise UsageError(f"--host {quoted(host)}: cannot serve on it here ({error.strerror})") from None


def check_ray(needed: str) -> None:
    if importlib.util.find_spec("ray") is None:
        raise UsageError(f"{needed} needs Ray: {SERVE_EXTRA}")


def check_demo(args) -> None:
    check_address(args)
    for flag in ("--image-model", "--text-target", "--text-draft", "--video-model"):
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None:
            check_model(value, flag)
    if importlib.util.find_spec("gradio") is None:
        raise UsageError(f"the demo needs Gradio: {APP_EXTRA}")
    check_port_free(args.host, args.port)


# --- commands -----------------------------------------------------------------------------------------------------
def print_comparison(runs: list[tuple[str, object, float]], unit: str, count: int, report: str | None) -> None:
    """The table of a command's runs (name, stats, seconds), the first one the baseline of the speedup column; with
    `report` (--json), the same figures and each run's stats written there as JSON."""
    print(f"\n{'method':<10}{'target forwards':>17}{'tokens/forward':>16}{unit:>15}{'speedup':>9}")
    for name, stats, seconds in runs:
        print(f"{name:<10}{stats.target_forwards:>17}{stats.tokens_per_target_forward:>16.2f}"
              f"{seconds / count:>15.3f}{runs[0][2] / seconds:>8.2f}x")
    write_report(report, [{"name": name, unit.replace("/", "_per_"): round(seconds / count, 6),
                           "speedup": round(runs[0][2] / seconds, 4), "stats": stats.as_dict()}
                          for name, stats, seconds in runs])


def write_report(path: str | None, runs: list[dict]) -> None:
    """--json: the command's runs as JSON at `path` (written whole or not at all); nothing without a path."""
    if path is not None:
        write_atomically(lambda file: Path(file).write_text(json.dumps({"runs": runs}, indent=1) + "\n"), path)
        print(f"wrote {path}: the figures above as JSON")


def serve_online(pipe, args, call: dict) -> int:
    """`mmspec text --online-every N`: each prompt one request, the draft LM learning from the target between them
    (updates in the background, swapped in before a request); one line of acceptance per request."""
    import torch

    learner = pipe.enable_online_drafting(pipe.online_drafter_for(args.method, args.settings), every=args.online_every)
    generator = torch.Generator(args.device).manual_seed(args.seed)
    for i, prompt in enumerate(args.prompt):
        out = pipe(prompt, decoding=args.method, generator=generator, **call, **args.settings)
        rate = out.stats.acceptance_rate
        print(prompt + out.texts[0])
        print(f"request {i + 1}: acceptance {'-' if rate is None else f'{rate:.2f}'}, "
              f"{out.stats.tokens_per_target_forward:.2f} tokens per target forward, {learner.updates} updates of the "
              f"{'head' if args.method == 'heads' else 'draft'} swapped in so far")
        print("-" * 60)
    pipe.disable_online_drafting()
    return 0


def run_text(args) -> int:
    import torch

    from mmspec.pipelines.text import SpeculativeTextPipeline

    draft = args.draft if uses_draft_model(args.method) else None
    pipe = SpeculativeTextPipeline.from_pretrained(args.target, draft=draft, dtype=getattr(torch, args.dtype))
    pipe.to(args.device)
    if args.remeasure:
        pipe.decoding_policy.remeasure()
    call = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)

    def decoded(method: str):
        return pipe(args.prompt, decoding=method, generator=torch.Generator(args.device).manual_seed(args.seed),
                    **call, **(args.settings if method != "ar" else {}))

    if args.online_every is not None:
        return serve_online(pipe, args, call)
    out = decoded(args.method)  # and AR once to compare: every figure printed comes from these runs
    for prompt, completion in zip(args.prompt, out.texts, strict=True):
        print(prompt + completion)
        print("-" * 60)
    print(f"decoding  {args.method}\n{out.stats.table()}")
    runs = [(args.method, out.stats, out.stats.timings["total"])]
    if args.method != "ar" and args.compare:  # the same call by the target's own generate
        ar = decoded("ar").stats
        runs.insert(0, ("ar", ar, ar.timings["total"]))
    print_comparison(runs, "ms/token", int(out.stats.new_tokens.sum()) / 1000, args.json)
    return 0


def run_generate(args) -> int:
    if args.prompts is not None:
        return run_prompt_file(args)
    import torch
    from diffusers.utils import make_image_grid

    from mmspec.pipelines.auto import image_pipeline_from_arguments

    pipe = image_pipeline_from_arguments(args).to(args.device)
    call = {"num_images_per_prompt": args.n, **image_sampling(args)}
    decoding = args.component or args.decoding  # the component the flags built, or "auto"
    if args.remeasure:
        pipe.decoding_policy.remeasure()

    def decoded(decoding, **options):
        generator = [torch.Generator(args.device).manual_seed(args.seed + i)
                     for i in range(len(args.prompt) * args.n)]
        return pipe(args.prompt, generator=generator, decoding=decoding, **call, **options)

    # one decode of the chosen method and, to compare, one of AR: every figure printed comes from these two runs
    # (the seconds are each decode's own, stats.timings["total"]: the default's measuring and the pixels' decoding
    # are not in them)
    out = decoded(decoding)
    images = out.images
    if args.upscale > 1:
        images = [im.resize((im.width * args.upscale, im.height * args.upscale), 0) for im in images]  # 0 = nearest
    write_atomically(make_image_grid(images, rows=len(args.prompt), cols=args.n).save, args.out)
    print(f"wrote {args.out}: {len(args.prompt)} prompt(s) x {args.n} image(s), one row per prompt")
    print(f"decoding  {args.decoding}\n{out.stats.table()}")
    runs = [(args.decoding, out.stats, out.stats.timings["total"])]
    if args.decoding != "ar" and args.compare:
        ar = decoded("ar", output_type="latent").stats
        runs.insert(0, ("ar", ar, ar.timings["total"]))
    print_comparison(runs, "seconds/image", len(out.images), args.json)
    return 0


def image_sampling(args) -> dict:
    """The sampling arguments of an image pipeline call, from `mmspec generate`'s flags."""
    return {"guidance_scale": args.guidance_scale, "cfg_interval": args.cfg_interval, "temperature": args.temperature,
            "top_k": args.top_k, "top_p": args.top_p, "height": args.height, "width": args.width,
            "negative_prompt": args.negative_prompt}


def run_prompt_file(args) -> int:
    """`mmspec generate --prompts FILE --out-dir DIR`: every prompt's images written there (`mmspec.serving.offline`),
    resumable; with --workers > 1 or --address, by Ray Data workers."""
    from tqdm.auto import tqdm

    from mmspec.serving import offline
    from mmspec.serving.calls import auto_decoding
    from mmspec.serving.models import served_model

    on_ray = args.workers > 1 or args.address is not None  # a worker's GPU is its only one: "cuda"
    device = args.device.type if on_ray else str(args.device)
    request, model = args.run, served_model(args.model, device=device, dtype=args.dtype)
    out_dir, work = Path(args.out_dir), offline.jobs(args.prompt, args.n, args.seed)
    pipe = None
    if request.decoding == "auto":
        print(f"choosing the decoding for calls of {args.batch_size} images (once for the whole run)", file=sys.stderr)
        pipe = model.load()
        request = replace(request, decoding=auto_decoding(pipe, request, args.batch_size))
    offline.start_run(out_dir, offline.run_record(args.model, args.prompt, args.n, args.seed, request))
    todo = offline.pending(out_dir, work)
    print(f"{len(work) - len(todo)} of {len(work)} images already in {out_dir}; {len(todo)} to generate",
          file=sys.stderr)
    if todo:
        with tqdm(total=len(todo), unit="image", desc="generating") as bar:
            if on_ray:
                offline.run_on_ray(model, request, out_dir, todo, args.batch_size, args.workers, bar.update,
                                   args.address)
            else:
                offline.run_locally(offline.Writer(pipe or model, request, str(out_dir)), todo, args.batch_size,
                                    bar.update)
    offline.gather_stats(out_dir, work)
    print(f"wrote {out_dir}: {len(work)} images and their stats ({offline.STATS_FILE})")
    return 0


def run_serve(args) -> int:
    """`mmspec serve`: the Ray Serve application of `mmspec.serving.service` until interrupted."""
    from mmspec.serving.models import connect, gpu_share
    from mmspec.serving.service import APP_NAME, Limits, build_app, start, stop, warm_up

    replicas = args.replicas * len(args.served)
    threads = max(1, (os.cpu_count() or 1) // replicas)
    # a replica sees the GPU Ray gives it as its only one: "cuda", whatever index this machine would call it
    models = [replace(model, device=args.device.type, dtype=args.dtype, threads=threads) for model in args.served]
    limits = Limits(args.max_batch_size, args.batch_wait_ms, args.request_timeout_s)
    gpus = gpu_share(replicas, connect(args.address)) if args.device.type == "cuda" else 0.0
    start(build_app(models, args.replicas, limits, gpus), args.host, args.port, args.address)
    print("choosing what decoding=\"auto\" stands for, once per model (its cost curve is measured on first use and "
          "cached)", file=sys.stderr, flush=True)
    warm_up()
    served = ", ".join(f"{model.id} ({model.modality})" for model in models)
    print(f"serving {served} on http://{args.host}:{args.port}/v1 ({args.replicas} replica(s) each); Ctrl-C stops",
          flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        if args.address is not None:
            stop(APP_NAME)  # the cluster's other applications keep serving
        else:
            stop(drain=False)  # the local instance ends with this process
    return 0


def run_video(args) -> int:
    import numpy as np
    import torch
    from diffusers.utils import export_to_gif, export_to_video

    from mmspec.pipelines.video import NextFramePipeline
    from mmspec.zoo.video_world import ACTIONS, episode, render_frame

    actions = parse_actions(args.actions, ACTIONS)
    pipe = NextFramePipeline.from_pretrained(args.model, dtype=getattr(torch, args.dtype)).to(args.device)
    if args.image:
        from PIL import Image

        start = np.asarray(Image.open(args.image).convert("RGB"))
    else:
        world = episode(args.episode, "heldout")
        start = render_frame(world, world.start)
    speculation = args.component  # None: sequential generation alone (--decoding ar)
    runs = [("speculative" if speculation else "sequential", speculation)]
    if speculation is not None and args.compare:
        runs.insert(0, ("sequential", None))
    pipe(start, actions[:2], decoding=speculation, num_inference_steps=args.steps)  # warm-up, untimed
    print(f"{'method':<13}{'FPS':>8}{'forwards':>10}{'computed':>10}{'discarded':>11}{'rollbacks':>11}")
    reported = []
    for name, spec in runs:
        out = pipe(start, actions, decoding=spec, num_inference_steps=args.steps,
                   generator=torch.Generator(args.device).manual_seed(args.seed))
        s = out.stats
        print(f"{name:<13}{s.fps:>8.1f}{s.target_forwards:>10}{s.frames_computed:>10}{s.frames_discarded:>11}"
              f"{s.rollbacks:>11}")
        reported.append({"name": name, "stats": s.as_dict()})
    frames = [frame.resize((frame.width * args.upscale,) * 2, 0) for frame in out.frames[0]]  # 0 = nearest
    if Path(args.out).suffix.lower() == ".mp4":
        write_atomically(lambda file: export_to_video(frames, file, fps=args.fps, macro_block_size=1), args.out)
    else:
        write_atomically(lambda file: export_to_gif(frames, file, fps=args.fps), args.out)
    print(f"wrote {args.out}: {len(frames)} frames of the {runs[-1][0]} rollout")
    write_report(args.json, reported)
    return 0


def run_models(args) -> int:
    """`mmspec models`: the embedded models, what each is, its size, and what uses it by default."""
    from mmspec.zoo import IMAGE_CLIP, IMAGE_T2I, MAR_C2I, TEXT_DRAFT, VIDEO_WORLD, zoo_names, zoo_path

    used_by = {IMAGE_T2I: "mmspec generate", TEXT_TARGET: "mmspec text", TEXT_DRAFT: "mmspec text (its draft)",
               VIDEO_WORLD: "mmspec video", MAR_C2I: 'MARPipeline.from_pretrained("mar_shapes")',
               IMAGE_CLIP: "python -m mmspec.eval.quality (CLIP score, FD-CLIP)"}
    print(f"{'name':<18}{'class':<22}{'MB':>6}  default of")
    for name in zoo_names():
        folder = zoo_path(name)
        index = folder / ("model_index.json" if (folder / "model_index.json").exists() else "config.json")
        config = json.loads(index.read_text())
        kind = config.get("_class_name") or (config.get("architectures") or ["?"])[0]
        megabytes = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20
        print(f"{name:<18}{kind:<22}{megabytes:>6.1f}  {used_by.get(name, '-')}")
    return 0


def run_demo(args) -> int:
    from mmspec.apps.demo import serve

    serve(kinds=(args.only,) if args.only else DEMO_TABS, image_model=args.image_model, text_target=args.text_target,
          text_draft=args.text_draft, video_model=args.video_model, host=args.host, port=args.port,
          device=args.device, dtype=args.dtype, warm_up=args.warm_up)
    return 0


# --- the parser ---------------------------------------------------------------------------------------------------
def build_parser() -> Parser:
    parser = Parser(prog="mmspec", description="Speculative decoding for AR generation.")
    parser.add_argument("--version", action="version", version=f"mmspec {metadata.version('mmspec')}")
    commands = parser.add_subparsers(dest="command", required=True)
    text = commands.add_parser("text", help="speculative text generation with a causal LM (default: the embedded pair)")
    text.add_argument("prompt", nargs="+", help="one or more prompts (several prompts are decoded as one batch)")
    text.add_argument("--method", choices=("auto", *method_names()), default="auto",
                      help="'auto': the fastest exact method here (each one timed on first use, cached); a drafter: "
                           + "; ".join(f"'{name}': {described(name)}" for name in method_names() if name != "ar")
                           + "; or 'ar' for the plain target")
    text.add_argument("--target", default=TEXT_TARGET, help="zoo name or transformers folder of the target")
    text.add_argument("--draft", default=TEXT_DRAFT,
                      help="zoo name or transformers folder of the draft (--method model / tree)")
    text.add_argument("--max-new-tokens", type=int, default=64)
    text.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    text.add_argument("--top-k", type=int, default=0)
    text.add_argument("--top-p", type=float, default=1.0)
    add_decoding_arguments(text, "text", "--method ")
    text.add_argument("--seed", type=int, default=0)
    text.add_argument("--online-every", type=int, default=None, metavar="N",
                      help="online speculative decoding: serve the prompts one request at a time, the draft LM "
                           "(--method model, cascade or tree) or the --kind head (--method heads) learning from the "
                           "target every N requests")
    text.add_argument("--remeasure", action="store_true",
                      help="auto: time the methods again instead of reading the cached figures")
    text.add_argument("--no-compare", dest="compare", action="store_false",
                      help="skip the run of the target's own generate that the method is compared with")
    add_json_argument(text)
    add_device_arguments(text, default="auto")

    image = commands.add_parser("generate", help="text-to-image generation (default: the embedded shapes model)")
    image.add_argument("prompt", nargs="*", help="one or more prompts (decoded as one batch)")
    image.add_argument("--prompts", default=None, metavar="FILE",
                       help="a file of prompts (text: one per line; TSV: its caption column; JSON: a list or COCO "
                            "captions): each prompt's --n images written into --out-dir, resumable (a restarted run "
                            "does what is not written yet)")
    image.add_argument("--out-dir", default=None, metavar="DIR",
                       help="with --prompts: where each image (NNNNNN-I.png) and its stats (NNNNNN-I.json, all in "
                            "stats.jsonl at the end) go")
    image.add_argument("--batch-size", type=int, default=None,
                       help="with --prompts: images per pipeline call (default 8)")
    image.add_argument("--workers", type=int, default=None,
                       help=f"with --prompts: Ray Data workers, one per GPU or CPU slot (default 1: this process); "
                            f"needs the [serve] extra: {SERVE_EXTRA}")
    image.add_argument("--address", default=None,
                       help="with --prompts: the Ray cluster to run the workers on ('auto': the one this machine "
                            "joined)")
    image.add_argument("--out", default="out.png", help=f"image to write ({', '.join(IMAGE_EXTENSIONS)}): one row "
                                                        "per prompt, --n images per row")
    image.add_argument("--n", type=int, default=1, help="images per prompt")
    image.add_argument("--seed", type=int, default=0, help="image i uses seed + i")
    image.add_argument("--guidance-scale", type=float, default=None,
                       help="classifier-free guidance; 1 = off (default: the family's, 3 for the embedded model)")
    image.add_argument("--cfg-interval", type=int, default=-1,
                       help="LlamaGen's cfg_interval: image tokens 0 .. N + 1 guided, the rest unguided (-1 = all)")
    image.add_argument("--temperature", type=float, default=1.0)
    image.add_argument("--top-k", type=int, default=None, help="default: the family's (0 = all codes)")
    image.add_argument("--height", type=int, default=None, help="pixels (default: the model's native size)")
    image.add_argument("--width", type=int, default=None, help="pixels (default: the model's native size)")
    image.add_argument("--negative-prompt", default=None, help="Emu3: the CFG rows' text")
    image.add_argument("--top-p", type=float, default=1.0)
    image.add_argument("--decoding", choices=("auto", *decodings("image")), default="auto",
                       help="'auto': the fastest exact decoding for this device and batch (SJD at the window a "
                            "measured cost curve favours, or AR when none pays); or a registered decoding, with its "
                            "settings below")
    add_decoding_arguments(image, "image", "--decoding ")
    image.add_argument("--remeasure", action="store_true",
                       help="auto: measure the window cost curve again instead of reading the cached one")
    image.add_argument("--no-compare", dest="compare", action="store_false",
                       help="skip the plain-AR run that the chosen decoding is compared with")
    add_image_model_arguments(image)
    add_json_argument(image)
    add_device_arguments(image, dtype=False, default="auto")  # --dtype is an image-model argument
    image.add_argument("--upscale", type=int, default=1, help="enlarge the written images (nearest neighbour)")

    video = commands.add_parser("video", help="action-conditioned video with frame speculation (embedded world)")
    video.add_argument("--actions", nargs="+", required=True,
                       help="one per frame: stay / up / down / left / right or 0-4, optionally *count, quoted for "
                            "the shell ('right*6')")
    video.add_argument("--decoding", choices=tuple(decodings("video")), default=FrameSpeculation.name,
                       help=f"'{FrameSpeculation.name}': frame speculation with the settings below (--frames at most "
                            "the rollout's; --frames 1 --context pipelined is sequential generation exactly); 'ar': "
                            "sequential generation alone")
    for name, owners in decoding_fields("video").items():
        add_setting(video, name, owners, "--decoding ")
    video.add_argument("--steps", type=int, default=4, help="Euler steps per frame")
    video.add_argument("--episode", type=int, default=0, help="start from this held-out episode's first frame")
    video.add_argument("--image", default=None, help="start from this frame (a 32 x 32 image) instead")
    video.add_argument("--seed", type=int, default=0)
    video.add_argument("--out", default="rollout.gif", help=f"GIF, or MP4 with the [video] extra: {VIDEO_EXTRA}")
    video.add_argument("--fps", type=int, default=8, help="frame rate of the written file")
    video.add_argument("--upscale", type=int, default=4, help="enlarge the written frames (nearest neighbour)")
    video.add_argument("--no-compare", dest="compare", action="store_false", help="skip the sequential run")
    video.add_argument("--model", default=VIDEO_WORLD, help="zoo name or saved NextFramePipeline folder")
    add_json_argument(video)
    add_device_arguments(video, default="auto")

    demo = commands.add_parser("demo", help="the Gradio demo (AR vs speculative, side by side, live)",
                               description=f"Serve the Gradio demo; it needs the [app] extra: {APP_EXTRA}")
    demo.add_argument("--only", choices=DEMO_TABS, default=None, help="show one tab only")
    demo.add_argument("--image-model", default=None, help="zoo name or saved pipeline folder (default: shapes)")
    demo.add_argument("--text-target", default=None, help="zoo name or transformers folder (default: pycode)")
    demo.add_argument("--text-draft", default=None, help="draft for the text target (default: the pycode draft)")
    demo.add_argument("--video-model", default=None, help="zoo name or saved NextFramePipeline folder (default: "
                                                          "nextframe_shapes)")
    demo.add_argument("--host", default="127.0.0.1", help="address to serve on (0.0.0.0 = every interface)")
    demo.add_argument("--port", type=int, default=7860)
    demo.add_argument("--no-warmup", dest="warm_up", action="store_false",
                      help="serve without warming up: each method initialises on its first request (auto times its "
                           "candidates then, for minutes on a CPU)")
    add_device_arguments(demo, default="auto")
    serve = commands.add_parser("serve", help="an HTTP service (OpenAI's Images / Completions API shape) on Ray Serve",
                                description=f"Serve models over HTTP with Ray Serve; it needs the [serve] extra: "
                                            f"{SERVE_EXTRA}")
    serve.add_argument("--model", action="append", default=None,
                       help="zoo name or folder of an image pipeline or a text target; repeat it to serve several "
                            f"(default: {' and '.join(DEFAULT_MODELS)})")
    serve.add_argument("--draft", default=None, help="the draft of the last --model, a text target (default: the "
                                                     "embedded draft for the embedded target)")
    serve.add_argument("--replicas", type=int, default=1,
                       help="replicas of each model (on CUDA one GPU each, or an equal share where the cluster has "
                            "fewer GPUs than replicas)")
    serve.add_argument("--max-batch-size", type=int, default=8,
                       help="rows (images, completions) one pipeline call serves at most, and a request's most")
    serve.add_argument("--batch-wait-ms", type=float, default=20.0,
                       help="how long a replica waits for more requests to fill a batch")
    serve.add_argument("--request-timeout-s", type=float, default=300.0,
                       help="a request not answered by then is cancelled and answered 504")
    serve.add_argument("--host", default="127.0.0.1", help="address to serve on (0.0.0.0 = every interface)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--address", default=None,
                       help="the Ray cluster to serve on ('auto': the one this machine joined; default: a local one)")
    add_device_arguments(serve, default="auto")
    commands.add_parser("models", help="list the embedded models", description="List the embedded (zoo) models: "
                                                                               "name, class, size, what uses it")
    return parser


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the figures (each run's stats and "
                                                                    "the comparison) to PATH as JSON")


COMMANDS = {"text": (check_text, run_text), "generate": (check_generate, run_generate),
            "video": (check_video, run_video), "demo": (check_demo, run_demo), "serve": (check_serve, run_serve),
            "models": (None, run_models)}


def main(argv: list[str] | None = None) -> int:
    try:
        load_plugins()  # their decodings and rules become choices and flags
    except ImportError as error:
        print(f"mmspec: error: {error}", file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    prog = f"mmspec {args.command}"
    check, run = COMMANDS[args.command]
    try:
        if check is None:  # loads nothing
            return run(args)
        check(args)
        if getattr(args, "json", None) is not None:
            check_output(args.json, (".json",), "--json")
        check_device(args)
        model = getattr(args, "model", None) or getattr(args, "target", None)
        # the first thing a user sees, at once: loading and a first run's measuring take seconds to minutes
        print(f"{prog}: loading {model or 'the models'} on {args.device}", file=sys.stderr, flush=True)
        return run(args)
    except (ValueError, TypeError) as error:  # a usage error, or input a model refused (a size it cannot make)
        parser.exit(2, f"{prog}: error: {in_flag_terms(str(error))}\n")


if __name__ == "__main__":
    sys.exit(main())
