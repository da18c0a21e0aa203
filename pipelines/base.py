"""`MMSpecPipeline`: the base of mmspec's diffusers pipelines. It adds two things to `DiffusionPipeline`:

- `from_pretrained` takes a zoo name ("shapes", "mar_shapes") as well as a folder or a hub id, and loads quietly
  without accelerate (the base install);
- components defined in `mmspec.models` are saved in `model_index.json` under their public import path,
  `["mmspec", "LlamaGenTransformer"]`, not the module that defines them today (`mmspec.models.llamagen.gpt`), so a
  saved pipeline keeps loading when code moves. Folders saved with module paths load as before;
- a saved folder also loads through diffusers' own entry point, `DiffusionPipeline.from_pretrained(folder,
  trust_remote_code=True)`: diffusers' custom-pipeline convention, `_class_name: [module, class]` in
  `model_index.json` and that module in the folder (`LOADER_MODULE`: it imports the class from `mmspec`).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from diffusers import DiffusionPipeline
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.utils import is_accelerate_available

from mmspec.core.component import DecodingComponent, component_from, rule_settings, setting_keywords
from mmspec.core.progress import P, Progress, run_to_end
from mmspec.core.registry import decodings
from mmspec.core.runtime.devices import check_available
from mmspec.core.settings import Settings, runtime_fields
from mmspec.zoo import resolve_model

PUBLIC_LIBRARY = "mmspec"  # every component class of mmspec.models is exported from the mmspec facade
COMPONENT_MODULES = "mmspec.models."
LOADER_MODULE = "mmspec_pipeline"  # the module a saved folder carries for diffusers' custom-pipeline loading


def public_component(entry):
    """A `model_index.json` entry `(library, class name)` with a component of `mmspec.models` named by its public
    path; any other entry (a transformers class, a scalar setting) unchanged."""
    if (isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[0], str)
            and entry[0].startswith(COMPONENT_MODULES)):
        return (PUBLIC_LIBRARY, entry[1])
    return entry


class MMSpecPipeline(DiffusionPipeline):
    """`DiffusionPipeline` that loads zoo names and saves its components under public import paths.

    A pipeline that decodes with components names their `modality` (its decodings are the registry's,
    `mmspec.core.registry.decodings(modality)`) and sets `self.decoding` in its `__init__`; the component is then
    saved in `model_index.json` and restored by `from_pretrained` (its `__init__` takes `decoding=`)."""

    modality: str | None = None
    _callback_tensor_inputs: list[str] = []  # what a step callback may ask for, first the default
    _interrupt = False  # a step callback sets it to stop the call early
    cuda_graphs: bool | None = None  # None: on whenever the pipeline is on a CUDA device (`enable_cuda_graphs`)
    steps_instead: str | None = None  # what sets the work of a call, said to a caller who passes num_inference_steps

    @property
    def interrupt(self) -> bool:
        return self._interrupt

    def to(self, *args, **kwargs):
        """diffusers' `to(device, dtype)`; a device this machine lacks is a ValueError naming it (not torch's bare
        assertion from deep inside the move)."""
        device = kwargs.get("device", next((a for a in args if isinstance(a, (str, torch.device))), None))
        if device is not None:
            check_available(torch.device(device), f"{type(self).__name__}.to({str(device)!r})")
        return super().to(*args, **kwargs)

    def enable_model_cpu_offload(self, *args, **kwargs):
        """diffusers' offload of each model to the CPU between its uses; it needs a GPU to offload from."""
        self.refuse_offload_without_accelerator("enable_model_cpu_offload")
        return super().enable_model_cpu_offload(*args, **kwargs)

    def enable_sequential_cpu_offload(self, *args, **kwargs):
        """diffusers' submodule-by-submodule offload to the CPU; it needs a GPU to offload from."""
        self.refuse_offload_without_accelerator("enable_sequential_cpu_offload")
        return super().enable_sequential_cpu_offload(*args, **kwargs)

    def refuse_offload_without_accelerator(self, method: str) -> None:
        if not torch.cuda.is_available():
            raise ValueError(f"{type(self).__name__}.{method}() moves models between a GPU and the CPU; this machine "
                             "has no GPU, and on the CPU the models already sit in CPU memory")

    def enable_attention_slicing(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not support attention slicing: its models attend "
                                  "through torch's scaled_dot_product_attention over a KV cache, which needs no "
                                  "slicing to bound its memory")

    disable_attention_slicing = enable_attention_slicing

    def status_bar(self, description: str, total: int):
        """A progress bar for work other than the call's steps (the default's first measurements), under the
        pipeline's progress bar settings (`set_progress_bar_config(disable=True)` silences it too)."""
        from tqdm.auto import tqdm

        return tqdm(total=total, **{**getattr(self, "_progress_bar_config", {}), "desc": description})

    def enable_cuda_graphs(self) -> None:
        """Replay the decoding's steps from CUDA graphs (what each pipeline captures is in its `graph_stores`
        docstring): captured on a first call, replayed by later calls of the same shape, outputs unchanged. A
        pipeline on a CUDA device does this by itself on its first call; `disable_cuda_graphs()` turns it off."""
        if self.device.type != "cuda":
            raise ValueError(f"enable_cuda_graphs needs the pipeline on a CUDA device (pipe.to('cuda')), it is on "
                             f"{self.device}")
        self.cuda_graphs = True
        self.graph_stores(True)

    def disable_cuda_graphs(self) -> None:
        self.cuda_graphs = False
        self.graph_stores(False)

    def replays_graphs(self) -> bool:
        """Whether this call replays from CUDA graphs (enabled, or never disabled on a CUDA device)."""
        if self.cuda_graphs is None and self.device.type == "cuda":
            self.enable_cuda_graphs()
        return bool(self.cuda_graphs)

    def graph_stores(self, on: bool) -> None:
        """Make (on) or drop the pipeline's captured graphs; a pipeline without any has nothing to do."""

    def supplied(self, component: Settings) -> Settings:
        """`component` (a decoding, or a rule) with what this pipeline supplies in the runtime fields it left unset,
        and so for the rule it holds: each field names the pipeline attribute that supplies it
        (`runtime(supplied_by=...)`: a draft head by the component's `kind`, the `acceptance_head`, the
        `kangaroo_adapter`, a judge rule's `judge_head`, an image draft model's adapter, whose method is called).
        What the pipeline lacks stays unset (`component.unsupplied()` names it)."""
        given = {}
        for name, supply in runtime_fields(component).items():
            source = supply.source(component)
            if getattr(component, name) is None and source is not None:
                value = getattr(self, source, None)
                value = value() if inspect.ismethod(value) else value
                if value is not None:
                    given[name] = value
        for field in dataclasses.fields(component):
            held = getattr(component, field.name)
            if isinstance(held, Settings) and field.name not in given:
                inner = self.supplied(held)
                if inner is not held:
                    given[field.name] = inner
        return dataclasses.replace(component, **given) if given else component

    @property
    def decoding(self) -> DecodingComponent | str:
        """What a call decodes with unless it says otherwise; saved in `model_index.json`, restored by
        `from_pretrained`; set it to swap (a component, a registered name or a saved config dict)."""
        return self._decoding

    @decoding.setter
    def decoding(self, value: DecodingComponent | str | dict) -> None:
        self._decoding = self.resolve_decoding(value)
        config = self._decoding if isinstance(self._decoding, str) else self._decoding.to_config()
        self.register_to_config(decoding=config)

    def check_keywords(self, settings: dict) -> None:
        """Refuse, by name, call keywords that are no registered decoding's setting (`setting_keywords`: the fields
        of the modality's registered decodings and the rules' flat spellings; a TypeError, as Python's own)."""
        unknown = sorted(set(settings) - set(setting_keywords(self.modality)))
        if "num_inference_steps" in unknown and self.steps_instead:  # a diffusers habit: say what counts steps here
            raise TypeError(f"{type(self).__name__}() takes no num_inference_steps: {self.steps_instead}")
        if unknown:
            raise TypeError(f"{type(self).__name__}() got unexpected keyword argument(s) {unknown}")

    def decoding_for_call(self, decoding, settings: dict) -> DecodingComponent | str:
        """A call's decoding: the one it names, with its settings (`decoding="sjd", window=8`); without a name, the
        pipeline's own component with the settings given (they are that component's); settings that no registered
        decoding takes are refused by name."""
        self.check_keywords(settings)
        given = {key: value for key, value in settings.items() if value is not None}
        if decoding is not None:
            return self.resolve_decoding(decoding, **given)
        if not given:
            return self.decoding
        if isinstance(self.decoding, str):
            takes = [name for name, cls in decodings(self.modality).items()
                     if set(given) & (set(cls.settings()) | set(rule_settings(self.modality)))]
            raise ValueError(f"{sorted(given)} set a named decoding; name it (decoding={' / '.join(map(repr, takes))}) "
                             f"or set the pipeline's own (pipe.decoding = ...), which is {self.decoding!r}")
        config = self.decoding.to_config()
        if "acceptance" in given or given.keys() & set(rule_settings(self.modality)):
            config.pop("acceptance", None)
        return self.resolve_decoding(config.pop("name"), **{**config, **given})

    def callback_tensor_inputs(self, callback, names: list[str] | None) -> list[str]:
        """The tensors a step callback gets: a `PipelineCallback`'s own, else `names`, else the first of
        `_callback_tensor_inputs`; a name outside `_callback_tensor_inputs` raises."""
        if isinstance(callback, (PipelineCallback, MultiPipelineCallbacks)):
            names = callback.tensor_inputs
        names = list(names or self._callback_tensor_inputs[:1])
        unknown = set(names) - set(self._callback_tensor_inputs)
        if unknown:
            raise ValueError(f"callback_on_step_end_tensor_inputs {sorted(unknown)} are not in "
                             f"{self._callback_tensor_inputs}")
        return names

    def run_step_callback(self, callback, step: int, n_done: int, tensors: dict) -> None:
        """`callback(pipe, step, n_done, tensors)`, diffusers' `callback_on_step_end` convention. What an AR pipeline
        generated is read-only (it already sits in the model's cache): a callback that returns a replaced tensor
        raises instead of being silently ignored."""
        returned = callback(self, step, n_done, dict(tensors)) or {}
        replaced = [name for name, value in returned.items() if name in tensors and value is not tensors[name]]
        if replaced:
            raise ValueError(f"callback_on_step_end returned new {replaced}: what an AR pipeline generated is "
                             "read-only (it already sits in the model's cache)")

    def run_decoding(self, steps: Iterator[P], callback, names: list[str], total: int) -> P:
        """Drive a decoding's run (`mmspec.core.progress.run_to_end`) to its last progress, which it returns: a
        progress bar over `total` (what every row finishes: tokens, frames) follows `progress.n_done`, `callback` is
        called with the progress's tensors `names` (`run_step_callback`), and `pipe._interrupt` stops the run."""
        self._interrupt = False
        with self.progress_bar(total=total) as bar:
            bar = None if getattr(bar, "disable", False) else bar

            def on_step(progress: Progress) -> bool:
                if bar is not None:
                    bar.update(progress.n_done - bar.n)
                if callback is not None:
                    self.run_step_callback(callback, progress.step, progress.n_done,
                                           {name: getattr(progress, name) for name in names})
                return self._interrupt

            return run_to_end(steps, on_step if callback is not None or bar is not None else None)

    def resolve_decoding(self, value: DecodingComponent | str | dict, **settings) -> DecodingComponent | str:
        """A component of this pipeline's modality from an object, a name plus settings, or a config dict."""
        return component_from(value, self.modality, **settings)

    def save_pretrained(self, save_directory, **kwargs) -> None:
        """diffusers' `save_pretrained`, then the loader module and `_class_name: [module, class]`, so that
        `DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)` loads the folder too."""
        super().save_pretrained(save_directory, **kwargs)
        folder, name = Path(save_directory), type(self).__name__
        (folder / f"{LOADER_MODULE}.py").write_text(
            f'"""Loads this folder through diffusers\' custom-pipeline convention: '
            f'DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)."""\n\n'
            f"from {PUBLIC_LIBRARY} import {name}  # noqa: F401\n")
        index = folder / "model_index.json"
        config = json.loads(index.read_text())
        config["_class_name"] = [LOADER_MODULE, name]
        index.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    @classmethod
    def load_config(cls, *args, **kwargs):
        # a folder this class saved names itself as [loader module, class]: loaded through the class itself, it needs
        # no loader (diffusers would otherwise import the module, and ask for trust_remote_code)
        loaded = super().load_config(*args, **kwargs)
        config = loaded[0] if isinstance(loaded, tuple) else loaded
        if config.get("_class_name") == [LOADER_MODULE, cls.__name__]:
            config["_class_name"] = cls.__name__
        return loaded

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        # without accelerate (the base install) diffusers would warn on every load that it falls back to this
        kwargs.setdefault("low_cpu_mem_usage", is_accelerate_available())
        return super().from_pretrained(resolve_model(pretrained_model_name_or_path), **kwargs)

    def register_to_config(self, **kwargs):
        # register_modules and component reassignment both record (library, class name) through here
        super().register_to_config(**{name: public_component(value) for name, value in kwargs.items()})
