"""Restoring: a run directory's checkpoints -> params on any mesh, one model or an ensemble, the newest step that
restores, a given one or the average of the last few, in either layer layout. What every tool that reads a
trained run starts from (`Restored`); generation, scoring and export take it from here."""

import dataclasses
import json
import os
import shutil

import jax
import ml_collections
from absl import logging

from transformer_jax.config import mesh as mesh_section
from transformer_jax.config.model import ModelConfig
from transformer_jax.core import files
from transformer_jax.core.workdir import Workdir
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.model import ensemble
from transformer_jax.model import layer_layout
from transformer_jax.model import transformer as model_lib
from transformer_jax.model.transformer import LanguageModel, Transformer
from transformer_jax.runtime import progress
from transformer_jax.runtime import sharding
from transformer_jax.training import checkpoint
from transformer_jax.training import steps


@dataclasses.dataclass
class Restored:
  """What inference needs: one model or an ensemble (members sharded on `mesh`), the tokenizer they share, and
  where each member's params come from."""

  config: ml_collections.ConfigDict  # the first member's run: its decode, eval and data settings serve them all
  members: tuple[ensemble.Member, ...]
  origins: tuple[dict, ...]  # per member {'workdir', 'steps'}: the checkpoint step(s) of its params (averaged)
  descriptions: tuple[str, ...]  # per member, which params these are in words (its final model, a step, ...)
  tokenizer: tokenizer_lib.Tokenizer
  mesh: jax.sharding.Mesh
  rules: tuple

  def on_mesh(self):
    """Traces and runs under this mesh with the logical-axis rules, as training does."""
    return sharding.activate(self.mesh, self.rules)

  @property
  def is_ensemble(self) -> bool:
    return len(self.members) > 1

  def _single(self) -> int:
    if self.is_ensemble:
      raise ValueError(f'this takes one model, not an ensemble of {len(self.members)}: pass one --workdir and at '
                       'most one --step.')
    return 0

  @property
  def model(self) -> Transformer | LanguageModel:
    return self.members[self._single()].model

  @property
  def params(self) -> dict:
    return self.members[self._single()].params

  @property
  def steps(self) -> list[int]:
    return self.origins[self._single()]['steps']

  @property
  def description(self) -> str:
    """Which params these are, in words: a run's final model, one step, an average; an ensemble's members."""
    return '; '.join(self.descriptions)

  @property
  def max_len(self) -> int:
    """The longest sequence every member accepts (`model.max_len`)."""
    return min(m.model.config.max_len for m in self.members)

  @property
  def position_limit(self) -> int | None:
    """The most tokens every member's positions cover (`ModelConfig.position_limit`; None: no limit)."""
    limits = [m.model.config.position_limit for m in self.members if m.model.config.position_limit is not None]
    return min(limits, default=None)

  def decode_length(self, input_length: int, max_len_offset: int) -> int:
    """Output tokens allowed for an input of `input_length` tokens by every member (`ModelConfig.decode_length`)."""
    return min(m.model.config.decode_length(input_length, max_len_offset) for m in self.members)


def inference_mesh(config) -> jax.sharding.Mesh:
  """All of this run's devices in one data-parallel axis: any checkpoint restores onto it."""
  mesh_cfg = ml_collections.ConfigDict(config.mesh.to_dict())
  mesh_cfg.shape = {'data': -1, 'fsdp': 1, 'tensor': 1}
  return sharding.make_mesh(mesh_cfg)


def final_model_steps(config, workdir: str) -> list[int]:
  """The checkpoint steps of the run's final model, which train.py's final evaluation and every tool's default use
  (`checkpoint.final_model_candidates`: the newest `eval.average_last` periodic saves), where none is damaged."""
  manager = checkpoint.open_existing(Workdir(workdir).checkpoints)
  saved = manager.all_steps()
  manager.close()
  return sorted(checkpoint.final_model_candidates(config, saved)[:config.eval.average_last])


def restore(config, workdir: str, *, step: int | None = None, average_last: int | None = None,
            mesh=None) -> Restored:
  """The run's final model (`final_model_steps`), the params of a given step, or the average of the last
  `average_last` checkpoints."""
  return restore_ensemble([(config, workdir, step)], average_last=average_last, mesh=mesh)


def restore_ensemble(runs, *, average_last: int | None = None, mesh=None) -> Restored:
  """An ensemble on one inference mesh (the first run's): for each (config, workdir, step) of `runs` the params of
  that step, of the run's final model (step None: `final_model_steps`, its newest periodic saves that restore) or
  the average of the newest `average_last` checkpoints.

  The members may differ in size but not in architecture, and must share the tokenizer (byte-identical
  SentencePiece models, whose size is every member's vocab_size). One run is one model. A checkpoint written with
  the other `model.scan_layers` layout is restored in its own and converted.
  """
  first_config, first_workdir, _ = runs[0]
  tok = tokenizer_lib.load_tokenizer(Workdir(first_workdir).tokenizer_model)
  mesh = mesh or inference_mesh(first_config)
  rules = mesh_section.rules_from_config(first_config.mesh)
  members, origins, descriptions = [], [], []
  for config, workdir, step in runs:
    _check_same_tokenizer(tok, Workdir(workdir).tokenizer_model)
    tokenizer_lib.check_vocab_size(tok, config.model.vocab_size)
    model = model_lib.make_model(ModelConfig.from_dict(config.model, sharding.mesh_platform(mesh)))
    if members and model.config.decoder_only != members[0].model.config.decoder_only:
      raise ValueError(f'{workdir} holds a {model.config.architecture} model and {first_workdir} a '
                       f'{members[0].model.config.architecture} one: an ensemble\'s members share the architecture.')
    params, chosen, which = _restore_params(config, model, workdir, step, average_last, mesh, rules)
    logging.info('restored %s', which)
    members.append(ensemble.Member(model, params))
    origins.append({'workdir': workdir, 'steps': chosen})
    descriptions.append(which)
  return Restored(first_config, tuple(members), tuple(origins), tuple(descriptions), tok, mesh, rules)


def _check_same_tokenizer(tok: tokenizer_lib.Tokenizer, path: str) -> None:
  if tokenizer_lib.load_tokenizer(path).model_proto != tok.model_proto:
    raise ValueError(f'{path} and {tok.path} are different SentencePiece models: ensemble only runs trained with '
                     'the same tokenizer (copy one run\'s tokenizer/spm.model into a new workdir before training it).')


def _restore_params(config, model, workdir: str, step, average_last, mesh, rules):
  """(params on `mesh` in `model`'s layer layout, the steps they come from, which params these are in words) of one
  run; see `restore_ensemble`."""
  directory = Workdir(workdir).checkpoints
  manager = checkpoint.open_existing(directory)
  target = steps.abstract_params(model, mesh, rules)

  def restore_step(step_: int):
    """A step's params in this model's layer layout, whichever layout (scanned or not) the run saved."""
    saved = checkpoint.saved_params(manager, step_)
    saved_scanned = layer_layout.is_scanned(saved)
    if saved_scanned == model.config.scan_layers:
      return checkpoint.restore_params(manager, step_, target, saved)
    saved_model = model_lib.make_model(model.config.replace(scan_layers=saved_scanned))
    params = checkpoint.restore_params(manager, step_, steps.abstract_params(saved_model, mesh, rules), saved)
    return layer_layout.convert_onto(params, target, model.config.scan_layers)

  try:
    if step is not None:
      if step not in manager.all_steps():
        raise ValueError(f'no checkpoint of step {step} in {directory}; available steps: '
                         f'{sorted(manager.all_steps())}.')
      with progress.Progress(f'restoring step {step} of {workdir}'):
        return restore_step(step), [step], f'{workdir} at step {step}'
    if average_last:
      candidates, count = sorted(manager.all_steps(), reverse=True), average_last
    else:
      candidates = checkpoint.final_model_candidates(config, manager.all_steps())
      count = min(config.eval.average_last, len(candidates))
    with progress.Progress(f'restoring {workdir}', total=count, unit='checkpoints') as restored:
      params, chosen = checkpoint.average_params(manager, candidates, lambda s: _counted(restore_step(s), restored),
                                                 count=count)
    if average_last:
      return params, chosen, f'{workdir}: the last {average_last} checkpoints, {checkpoint.describe_steps(chosen)}'
    saved = _averaged_origin(workdir)
    if saved is not None:  # a saved average (`save_averaged`): its one checkpoint holds other steps' mean
      return params, chosen, f'{workdir}: the saved average of steps {saved["steps"]} of {saved["workdir"]}'
    return params, chosen, (f'the final model of {workdir} (its last eval.average_last={config.eval.average_last} '
                            f'periodic saves): {checkpoint.describe_steps(chosen)}')
  finally:
    manager.close()


def _counted(params, restored: progress.Progress):
  restored.advance()
  return params


def _averaged_origin(workdir: str) -> dict | None:
  """In a workdir `save_averaged` finished: the run and steps its params average (`Workdir.averaged_from_file`);
  None elsewhere."""
  path = Workdir(workdir).averaged_from_file
  return files.read_json(path, 'averaged params\' origin') if os.path.isfile(path) else None


def save_averaged(restored: Restored, workdir: str) -> tuple[str, bool]:
  """Writes the restored params (one model's, averaged) as a workdir of their own, `Workdir.averaged`: the run's
  config.json and tokenizer and a params-only checkpoint at the last averaged step, then where they come from
  (`Workdir.averaged_from_file`, last: a save that did not finish has none), so that every tool reads it as it reads
  a run. Never over another average: the same average saved before is left as it is. Returns (its path, whether it
  was written now)."""
  run = Workdir(workdir)
  out = run.averaged(restored.steps)
  origin = {'workdir': os.path.abspath(workdir), 'steps': list(restored.steps)}
  if os.path.exists(out.path):
    if _averaged_origin(out.path) != origin:
      raise ValueError(f'{out.path} exists and is not a finished save of the average of steps {origin["steps"]} of '
                       f'{workdir}: move it away to save this average there.')
    return out.path, False
  if jax.process_index() == 0:
    out.ensure_writable()
    shutil.copyfile(run.config_file, out.config_file)
    shutil.copytree(os.path.dirname(run.tokenizer_model), os.path.dirname(out.tokenizer_model))
  manager = checkpoint.make_manager(out.checkpoints, async_save=False)
  checkpoint.save(manager, restored.steps[-1], {'params': restored.params}, force=True)
  manager.wait_until_finished()
  manager.close()
  if jax.process_index() == 0:
    files.write_atomically(out.averaged_from_file, json.dumps(origin, indent=2))
  return out.path, True
