"""The ``fxmem`` command (also ``python -m fxmem``).

``fxmem analyze TARGET ...`` traces one step of the model and prints or writes its report.
Errors are one line on stderr, ``fxmem: error: ...``, naming what was wrong and what to do,
with an exit code: 2 bad usage or input, 3 the step could not be traced, 130 interrupted, 1 a
bug in fxmem (``--debug`` shows the traceback). When B does not fit the budget the report
still comes, with the ways that make it fit (:mod:`fxmem.report.fit`), one line on stderr and
exit code 4. No other library's log line or warning is shown, and ``--out`` is written whole
or not at all.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from dataclasses import replace

import click
import torch
import torch.nn.functional as F  # noqa: N812

from ..errors import FxmemError, InputError, one_line
from ..trace.kernels import AMP, accepted, dtype_of
from .auto import compile_option, compiled_line
from .collector import paced
from .failing import EXIT_BUDGET, EXIT_INTERRUPTED, EXIT_USAGE, failing, silenced
from .files import check_out, plain_text, write_file
from .strategies import data_parallel, tensor_parallel

LOSSES = {"cross_entropy": F.cross_entropy, "mse": F.mse_loss, "none": None}
OPTIMIZERS = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD", "adagrad": "Adagrad",
              "rmsprop": "RMSprop", "adamax": "Adamax", "nadam": "NAdam", "radam": "RAdam",
              "adadelta": "Adadelta", "rprop": "Rprop", "asgd": "ASGD", "lbfgs": "LBFGS",
              "adafactor": "Adafactor", "none": None}
FORMATS = ("table", "json", "md", "html")


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=(
    "Errors are one line on stderr, 'fxmem: error: ...', naming what was wrong and what to "
    "do, with an exit code: 2 usage or input, 3 the step cannot be traced, or the model "
    "itself fails at an op as eager PyTorch would (the line says which, and names the op, "
    "the module and your source line), 130 interrupted, "
    "1 a bug in fxmem (--debug shows its traceback). When B does not fit the budget, the "
    "report still comes, with each way that makes it fit, and one line on stderr, exit "
    "code 4. Nothing else is printed: no other library's log line or warning; --out is "
    "written whole or not at all."))
@click.version_option(package_name="fxmem")
def cli():
    """fxmem: the device memory of a PyTorch step as a formula of the batch size B."""


@cli.command()
@click.argument("target")
@click.option("--input", "inputs", multiple=True, metavar="SPEC",
              help="An input tensor, DIMS[:DTYPE[:HIGH]] with B for the batch at any dim: "
                   "B,3,32,32, B,128:int64:50257, L,B,64 (sequence-first), 2,B,64 (an h0); "
                   "no B: no batch dim. HIGH: integer values in [0, HIGH). Repeat for "
                   "several inputs, one per parameter of forward. DTYPE (default float32): "
                   f"{accepted()} (any case, torch.float16 too).")
@click.option("--target", "targets", multiple=True, metavar="SPEC",
              help="A target tensor passed to the loss after the output, e.g. B:int64:10 "
                   "or L,B:int64:10.")
@click.option("--loss", type=click.Choice(sorted(LOSSES)), default=None,
              help="Loss of (output, *targets); none: the model returns the loss (or .loss). "
                   "Default: cross_entropy with --target, else none.")
@click.option("--optimizer", type=click.Choice(sorted(OPTIMIZERS)), default="none",
              show_default=True, help="torch.optim optimizer stepped after backward.")
@click.option("--foreach/--no-foreach", default=None,
              help="The optimizer's foreach= (default: PyTorch's choice, foreach on CUDA); "
                   "--no-foreach steps each parameter alone.")
@click.option("--amp", default="none", show_default=True, metavar="DTYPE",
              help="Forward and loss under autocast with the device's rules (fp16 training "
                   f"steps through a GradScaler): {accepted(AMP)}, or none.")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda",
              show_default=True, help="cuda: allocator blocks and CUDA's defaults; cpu: "
                                      "live bytes.")
@click.option("--compute-capability", "capability", default=None, metavar="MAJOR.MINOR",
              help="The GPU whose kernels --device cuda follows (9.0 H100, 8.0 A100, 8.6 "
                   "RTX 30xx, 8.9 L4/RTX 40xx, 7.5 T4, 10.0 B200): attention backends "
                   "and workspace sizes depend on it. Default: --gpu's, else 9.0.")
@click.option("--inference", is_flag=True,
              help="An inference step: the model in eval mode, forward only under no_grad "
                   "(hf: models without their labels, so no loss).")
@click.option("--grad-accum", type=click.IntRange(min=1), default=1, show_default=True,
              help="Micro-batches per optimizer step (B is one micro-batch).")
@click.option("--compile", "compiled", is_flag=True,
              help="torch.compile the model (under --fsdp, --ddp, --tp: each repeated block): "
                   "inductor's code traced (a CUDA build with a GPU or the fake GPU).")
@click.option("--compile-budget", type=click.FloatRange(0, 1, min_open=True), default=None,
              metavar="FRACTION", help="With --compile: AOTAutograd's "
              "activation_memory_budget (below 1: recompute more in backward, save less).")
@click.option("--batch", type=click.IntRange(min=1), default=32, show_default=True,
              help="The B the report's numbers are given at.")
@click.option("--budget", metavar="SIZE", default=None,
              help="Device memory the step may use (24GiB, 500MB, bytes): the largest B "
                   "that fits. With --device cuda, the bytes the caching allocator can get "
                   "(the card's capacity less the CUDA context): the largest B whose steps "
                   "run through the allocator's replay.")
@click.option("--gpu", default=None, metavar="NAME",
              help="A card whose capacity, less the CUDA context, is the budget: H100-80GB, "
                   "A100-80GB, A100-40GB, L40S, A10, RTX4090, RTX3090, T4, V100-32GB. Sets "
                   "--compute-capability unless given.")
@click.option("--cuda-context", "cuda_context", default=None, metavar="SIZE",
              help="Device memory the CUDA context takes outside the allocator, with --gpu "
                   "(default 512MiB, an estimate: measure yours as total - free - "
                   "memory_reserved() after a step).")
@click.option("--checkpoint", metavar="auto|none|PATH,...|PLAN.json", default="none",
              show_default=True,
              help="Activation checkpointing: auto (the cheapest plan that fits --budget at "
                   "--batch, on CUDA running in the caching allocator's replay, else the "
                   "smallest peak; whole blocks, groups of blocks and selective "
                   "checkpointing; with --compile, torch.compile's activation memory "
                   "budgets too), none, module paths, or a plan file that "
                   "--save-plan or fxmem.Plan.to_json wrote.")
@click.option("--save-plan", "save_plan", default=None, metavar="FILE",
              help="Write the checkpoint plan in effect as JSON, for a training script: "
                   "fxmem.apply_checkpoints(model, fxmem.load_plan(FILE)).")
@click.option("--config", "config", multiple=True, metavar="KEY=VALUE",
              help="Keyword arguments for the model's class or factory (hf: targets: for "
                   "the config class; timm:, torchvision:: for the model), e.g. n_layer=6; "
                   "an unknown key is an error naming the closest field.")
@click.option("--dim", "dim_sizes", multiple=True, metavar="NAME=SIZE",
              help="A named dim used in --input/--target specs (B,L:int64:50257), e.g. "
                   "L=512: a symbol like B; the report's numbers are at this size.")
@click.option("--seq", type=click.IntRange(min=1), default=None,
              help="Sequence length of hf: text models, which trace it as a symbol L: the "
                   "report's numbers are at this L (default: min(512, max positions)).")
@click.option("--cudnn-workspace", default=None, metavar="SIZE",
              help="Workspace each cuDNN convolution holds while it runs (device cuda), "
                   "e.g. 256MiB: a bound when the job sets CUDNN_CONV_WSCAP_DBG=256 (MiB). "
                   "Default: left out.")
@click.option("--fsdp", "fsdp", type=click.IntRange(min=1), default=None, metavar="RANKS",
              help="Data parallel with FSDP2 (fully_shard on each block of the model's "
                   "stacks, then the root) over RANKS GPUs: the report is per rank, B each "
                   "rank's micro-batch, shown for the ranks with the least room.")
@click.option("--ddp", "ddp", type=click.IntRange(min=1), default=None, metavar="RANKS",
              help="Data parallel with DistributedDataParallel over RANKS GPUs (each a whole "
                   "replica, gradients all-reduced in 25 MiB buckets): the report is per "
                   "rank, B each rank's micro-batch.")
@click.option("--tp", "tp", type=click.IntRange(min=1), default=None, metavar="RANKS",
              help="Tensor parallel over RANKS GPUs (parallelize_module): with the model's "
                   "own Hugging Face plan, or --tp-plan's; with --fsdp, FSDP2 over TP on a "
                   "(dp, tp) mesh of fsdp x tp GPUs. B is each rank's batch.")
@click.option("--tp-plan", "tp_plan", default=None, metavar="FILE.py:NAME",
              help="With --tp: the plan, a dict of module path to a PyTorch parallel style "
                   "(ColwiseParallel(), ...) named NAME in FILE.py or package.module.")
@click.option("--zero1", is_flag=True,
              help="With --ddp: the optimizer state partitioned over the ranks "
                   "(ZeroRedundancyOptimizer, ZeRO stage 1).")
@click.option("--reshard/--no-reshard", default=True, show_default=True,
              help="With --fsdp: free each block's gathered parameters after its forward "
                   "(FSDP2's reshard_after_forward).")
@click.option("--replicate", type=click.IntRange(min=1), default=None, metavar="R",
              help="With --fsdp: HSDP, R replicas of RANKS/R GPUs each, the parameters "
                   "sharded within a replica (fully_shard on an (R, RANKS/R) mesh).")
@click.option("--offload", is_flag=True,
              help="With --fsdp: FSDP2's CPU offload (CPUOffloadPolicy): the shards, their "
                   "gradients and the optimizer state in host memory, the optimizer step on "
                   "the host; the device holds the gathered blocks and the activations.")
@click.option("--param-dtype", default=None, metavar="DTYPE",
              help="With --fsdp: the dtype parameters are gathered and computed in "
                   "(FSDP2's MixedPrecisionPolicy), e.g. bf16.")
@click.option("--reduce-dtype", default=None, metavar="DTYPE",
              help="With --fsdp: the dtype gradients are reduce-scattered in, e.g. fp32.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table",
              show_default=True, help="Output format. table shows a checkpoint frontier "
              "of more than 16 points as 16 evenly spaced; md, json and html give every one.")
@click.option("--out", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the report here instead of stdout.")
@click.option("--whatif", is_flag=True,
              help="Add the seed article's ways to save memory (smaller batch, mixed "
                   "precision, gradient accumulation, no_grad, checkpointing) as rows; needs "
                   "--budget and a training step. With --fsdp/--ddp the rows are the "
                   "step on one GPU, and a sharding row: the step on each rank.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="Modules listed in the breakdown at the peak.")
@click.option("--exact-formula", is_flag=True,
              help="The table shows the exact peak (a Max of the allocator's roundings and "
                   "kernel thresholds) beside the readable polynomial it leads with; md, html "
                   "and json always hold it. Where --checkpoint auto chose a plan, the "
                   "setup's peak in B and L without it is exact too.")
@click.option("--jobs", type=click.IntRange(1, 2), default=2, show_default=True, help="2: a "
              "forked child finds some ways out of a B that does not fit, beside; 1: none.")
@click.option("--debug", is_flag=True, help="Show the traceback of an error.")
def analyze(target, inputs, targets, loss, optimizer, foreach, amp, device, capability,
            inference,
            grad_accum, compiled, compile_budget, batch, budget, gpu, cuda_context, checkpoint,
            save_plan, config, dim_sizes, seq, cudnn_workspace, fsdp, ddp, tp, tp_plan, zero1,
            reshard, replicate, offload, param_dtype, reduce_dtype, fmt, out, whatif, top,
            exact_formula, jobs, debug):
    """Analyse one step of the model TARGET: path/to/file.py:ClassOrFactory,
    package.module:ClassOrFactory, timm:NAME, torchvision:NAME (a classifier), or Hugging
    Face's hf:PRESET, hf:ConfigClass (hf:T5Config), hf:path/to/config.json or hf:ORG/NAME
    (its config.json in your Hugging Face cache). Presets: gpt2, llama, mistral, bert, and
    published configs of Llama 3.x (hf:llama-3.1-8b), Mistral, Mixtral (hf:mixtral-8x7b),
    Qwen 2.5 and 3 (hf:qwen3-30b-a3b), DeepSeek-V3, Gemma 2 and 3 and Phi; an unknown name
    lists them all (docs/models.md). Families are built with random weights on the meta device
    (nothing is downloaded), with their input size, classes and sequence length taken from
    the model's config; --config keys are checked against its fields."""
    # the collector paced (fxmem.cli.collector) through the report's rendering too: its full
    # passes once the analysis ends walked every trace the command made
    with paced():
        with failing(debug):
            check_out(out)  # before any work: a report with nowhere to go is lost
            if save_plan:
                check_out(save_plan, "--save-plan")
            if device == "cpu" and capability is not None:
                raise InputError("--compute-capability names the GPU whose kernels --device "
                                 "cuda follows: drop it with --device cpu")
            parallel = tensor_parallel(tp, tp_plan, ddp, data_parallel(
                fsdp, ddp, zero1, reshard, param_dtype, reduce_dtype, replicate, offload))
            if compiled and checkpoint == "auto" and not inference:
                from .auto import check

                check(compile_budget)
            with silenced():
                text, fit = _analyze(
                    target, inputs, targets, loss, optimizer, amp, device, inference,
                    grad_accum, batch, budget, checkpoint, config, seq, fmt, top, whatif,
                    dim_sizes, cudnn_workspace=cudnn_workspace, capability=capability,
                    gpu=gpu, cuda_context=cuda_context, parallel=parallel,
                    save_plan=save_plan, exact_formula=exact_formula,
                    compile=compile_option(compiled, compile_budget), jobs=jobs,
                    foreach=foreach)
            if out:
                write_file(out, text if isinstance(text, str) else plain_text(text))
        if save_plan:
            click.echo(f"wrote the checkpoint plan to {save_plan}", err=True)
        if out:
            click.echo(f"wrote {out}", err=True)
        elif fmt == "table":
            from rich.console import Console

            Console().print(text)
        else:
            click.echo(text, nl=False)
        if fit is not None and not fit:  # the report says it all; scripts get exit 4
            click.echo(f"fxmem: {one_line(fit.line, 2000)}", err=True)
            sys.exit(EXIT_BUDGET)


@cli.command()
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="cpu: the same protocol on this machine's CPU, small models, live bytes.")
@click.option("--scale", type=click.Choice(["full", "small"]), default=None,
              help="Model sizes (default: full on CUDA, small on CPU).")
@click.option("--only", multiple=True, metavar="CASE", help="A case name (repeatable).")
@click.option("--out-md", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the Markdown table here.")
@click.option("--out-json", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the JSON table here.")
@click.option("--fake-gpu", "fake_gpu", metavar="PYTHON", default=None,
              type=click.Path(exists=True, dir_okay=False),
              help="Run it all on the fake GPU: in PYTHON (a CUDA build of torch with fxmem's "
                   "requirements), with fxmem's stub driver; no GPU needed.")
@click.option("--debug", is_flag=True, help="Show the traceback of an error.")
def validate(device, scale, only, out_md, out_json, fake_gpu, debug):
    """Run the validation zoo (fxmem.validate.zoo) on a device: fxmem's predictions against measured
    steps, as a Markdown table (also python -m fxmem.validate)."""
    from ..validate.harness import to_json, to_markdown
    from ..validate.harness import validate as run_validation

    with failing(debug):
        for path in (out_md, out_json):
            check_out(path)
        if fake_gpu is not None:
            if device != "cuda":
                raise InputError("--fake-gpu runs the CUDA harness: --device cuda")
            from ..validate.fakegpu.remote import run_module

            args = [*(["--scale", scale] if scale else []),
                    *[a for o in only for a in ("--only", o)],
                    *(["--out-md", out_md] if out_md else []),
                    *(["--out-json", out_json] if out_json else []),
                    *(["--debug"] if debug else [])]
            code = run_module(fake_gpu, "fxmem.validate", args)  # its output is the answer
            if code:
                raise SystemExit(code)
            return
        with silenced():
            v = run_validation(device, scale, list(only) or None)
        md = to_markdown(v)
        for path, text in ((out_md, md), (out_json, to_json(v))):
            if path:
                write_file(path, text)
    click.echo(md, nl=False)


def _analyze(target, inputs, targets, loss, optimizer, amp, device, inference, grad_accum,
             batch, budget, checkpoint, config, seq, fmt, top, whatif=False, dim_sizes=(),
             cudnn_workspace=None, capability=None, gpu=None, cuda_context=None,
             parallel=None, save_plan=None, exact_formula=False, compile=None, jobs=1,
             foreach=None):
    from rich.console import Console

    from ..analyze import analyze as run_analysis
    from ..analyze import analyzer
    from ..report.ahead import param_dtype_ahead, param_dtype_early, reanalyze_of
    from ..report.fit import in_dims_at
    from ..report.ranks_ahead import fewest_early
    from ..report.summary import summarize
    from ..trace.engine import Step
    from .targets import (
        SetupRows,
        batch_dim_of,
        check_positions,
        load_target,
        longest_rows,
        named_dims,
        parse_capability,
        parse_config,
        parse_size,
        parse_tensor,
        position_limit,
    )

    budget_bytes = parse_size(budget) if budget is not None else None
    if budget_bytes is not None and budget_bytes < 1:
        raise InputError(f"--budget {budget}: give a positive size, e.g. 24GiB")
    conv_ws = parse_size(cudnn_workspace) if cudnn_workspace is not None else 0
    card, context = _card(gpu, cuda_context, budget_bytes, device)
    if card is not None:
        budget_bytes = card.usable_bytes(context)
    cc = parse_capability(capability) if capability is not None else (
        card.compute_capability if card is not None else (9, 0))
    amp_dtype = None if amp.strip().lower() == "none" else dtype_of(amp, AMP, what="--amp")
    if conv_ws and device != "cuda":
        raise InputError("--cudnn-workspace is a CUDA figure: it needs --device cuda")
    if inference:
        _check_inference(optimizer, checkpoint, targets, loss, grad_accum, whatif)
    given = parse_config(dim_sizes, "--dim")
    for name, v in given.items():
        if name == "B":
            raise InputError("--dim B: B is the batch size; give the report's B with --batch")
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"--dim {name}={v}: the size must be a positive integer")
    t = load_target(target, parse_config(config), seq)
    if seq is not None and "L" not in t.dims:
        raise InputError(f"--seq sets the sequence length of hf: text models, not of {target}: "
                         "name the length in the spec and size it with --dim (--input "
                         "B,L:int64:VOCAB --dim L=128)")
    specs = inputs or (t.inference_inputs if inference and t.inference_inputs is not None
                       else t.inputs)
    if inference:  # dropout off, batch norm on its running statistics: as inference runs
        t.model.eval()
    if not specs:
        raise InputError("give the model's inputs with --input (e.g. --input B,3,32,32)")
    tgt_specs = targets or t.targets
    # a compiled step: its example batch the asked one, as a run compiles at its own batch
    hint, sizes = batch if compile is not None and batch >= 2 else 8, {**t.dims, **given}
    xs = tuple(parse_tensor(s, hint, sizes) for s in specs)
    ys = tuple(parse_tensor(s, hint, sizes) for s in tgt_specs)
    dims = named_dims([*specs, *tgt_specs])
    at_dims = {n: sizes[n] for n in dims}  # the named dims at their --dim (--seq) sizes
    unused = set(given) - set(dims)
    if unused:
        raise InputError(f"--dim {sorted(unused)[0]} is not used by any --input/--target spec")
    check_positions(t.model, specs, sizes)
    loss_name = loss or t.loss or ("cross_entropy" if ys else "none")
    if inference:
        ys, loss_name = (), "none"
    elif loss_name != "none" and not ys:
        raise InputError(f"--loss {loss_name} takes the output and a target: give --target "
                         "(e.g. B:int64:CLASSES)")
    elif loss_name == "none" and ys:
        raise InputError("with --loss none the model returns its own loss, so --target goes "
                         "nowhere: drop --target or name a --loss")
    if not checkpoint.strip() or not checkpoint.replace(",", "").strip():
        raise InputError("--checkpoint takes auto, none or module paths (e.g. layer1,layer2)")
    where = tuple(batch_dim_of(s) for s in (*specs, *tgt_specs))[:len(xs) + len(ys)]
    if all(d is None for d in where):
        raise InputError("no --input/--target spec has B: write B at the batch's dim "
                         "(B,3,32,32, or L,B,64 for a sequence-first model)")
    opt_name = OPTIMIZERS[optimizer]
    opt = getattr(torch.optim, opt_name) if opt_name else None
    if foreach is not None:
        opt = with_foreach(opt, optimizer, foreach)
    if whatif and (inference or budget_bytes is None):
        raise InputError("--whatif compares training setups within a budget: give --budget "
                         "(and no --inference)")
    if checkpoint.strip().endswith(".json"):
        from ..trace.plans import load_plan

        plan = load_plan(checkpoint.strip())
    else:
        plan = () if checkpoint in ("none", "auto") else tuple(
            p.strip() for p in checkpoint.split(",") if p.strip())
    auto_compiled = checkpoint == "auto" and compile is not None and not inference
    step = Step(loss=LOSSES[loss_name], optimizer=opt, train=not inference, device=device,
                amp=amp_dtype, grad_accum=grad_accum, compute_capability=cc,
                compile=None if auto_compiled else compile)  # then auto compiles the budgets
    status = Console(stderr=True).status(f"tracing {t.name} on fake tensors ...")
    with status, contextlib.ExitStack() as stack:
        again = analyzer(t.model, xs, ys, step=step, dims=dims or None, batch_dim=where,
                         parallel=parallel)  # the ways started before the first trace:
        asked = dict(step=step, parallel=parallel, B=batch, budget_bytes=budget_bytes,
                     cudnn_workspace=conv_ws, at_dims=at_dims, jobs=jobs)  # FSDP2's mixed
        sooner, ahead = None if plan else param_dtype_early(  # precision, the fewest GPUs
            again, **asked, first=checkpoint == "auto"), None  # for a step on one GPU
        ranks = None if plan else fewest_early(again, **asked)
        stack.callback(lambda: [w.cancel() for w in (sooner, ahead, ranks) if w is not None])
        try:
            report = run_analysis(t.model, xs, ys, step=step, checkpoint=plan or None,
                                  dims=dims or None, batch_dim=where, parallel=parallel)
        except FxmemError as e:  # a spec without B next to ones with it: likely a typo
            no_b = [s for s, d in zip(specs, where) if d is None]
            if not no_b or all(d is None for d in where):
                raise
            raise InputError(f"--input {no_b[0]} has no B, so it has no batch dim and the "
                             "step fails: if its dim 0 is the batch, write B there (the "
                             f"error: {one_line(str(e), 300)})") from e
        ahead = param_dtype_ahead(report, batch, budget_bytes, conv_ws, at_dims, jobs,
                                  first=checkpoint == "auto", early=sooner)  # or stops it
        # the setup's rows in B and the dims, made with the summary (no way out reads them)
        extra, named, key = {}, report, f"peak in B, {', '.join(dims)}"
        if dims:  # the formula in B and the named dims; numbers at the --dim sizes
            extra["peak"] = lambda: {key: str(named.peak)}
            if budget_bytes is not None and len(dims) == 1 and not auto_compiled:
                extra["longest"] = lambda: longest_rows(named, *dims, budget_bytes, batch,
                                                        position_limit(t.model), conv_ws)
                in_dims_at(named, batch)  # (the rows read B in the dims: so does the report)
            report = at = report.at(**at_dims)
        # a data-parallel report stays whole: the summary shows the per-rank table and the
        # report of the ranks with the least room (fxmem.report.summary.summarize)
        frontier, compiled_as = (), compiled_line(step.compile, parallel is not None)
        if checkpoint == "auto" and not inference:  # under --fsdp/--ddp: one plan, all ranks
            from .auto import choose, unplanned_peak

            status.update("choosing a checkpoint plan ..." if not auto_compiled else
                          "choosing a checkpoint plan or torch.compile budget (compiling) ...")
            chosen = choose(report, batch, budget_bytes, conv_ws, auto_compiled, jobs)
            report, frontier = chosen.report, chosen.frontier
            compiled_as = chosen.setup_line(auto_compiled, parallel is not None) or compiled_as
            if dims and report is not at and not exact_formula:  # the step without the plan
                extra["peak"] = lambda: {key: unplanned_peak(named, batch, at_dims)}
            if dims and report is not at and "longest" in extra:  # its longest L, said so
                extra["longest"] = lambda: longest_rows(named, *dims, budget_bytes, batch,
                                                        position_limit(t.model), conv_ws, True)
        if save_plan:
            from ..trace.plans import Plan

            write_file(save_plan, Plan.of(report.plan).to_json(indent=1) + "\n")
        setup = {"model": target, "inputs": " ".join(specs),
                 **({"targets": " ".join(tgt_specs)} if ys else {}),
                 "loss": loss_name if not inference else "(inference)",
                 "optimizer": optimizer + ("" if foreach is None else
                                           f" (foreach={foreach})"), "amp": amp,
                 **({"compiled": compiled_as} if compiled_as else {}),
                 **({"GPU compute capability": f"{cc[0]}.{cc[1]}"} if device == "cuda"
                    else {}), **({"checkpoint": checkpoint} if checkpoint != "none" else {}),
                 **{f"dim {n}": v for n, v in at_dims.items()}}
        summary_of = functools.partial(
            summarize, report, B=batch, budget_bytes=None if card else budget_bytes, top=top,
            title=f"fxmem report: {t.name}", frontier=frontier, cudnn_workspace=conv_ws,
            gpu=card, context_bytes=context,
            **(dict(named=named, dims=at_dims) if dims and report is at else {}))
        summary = functools.partial(summary_of, setup=SetupRows(setup, list(extra.values())))
        # made while fit's child searches the longest length: the summary without that row,
        # whose formulas and replays the reports keep for the summary made after it
        early_parts = functools.partial(summary_of, setup=SetupRows(
            setup, [f for k, f in extra.items() if k != "longest"]))
        fit, early = None, {}  # early: the summary made while a child searched ways
        if budget_bytes is not None:  # when B does not fit: the report, its ways out, exit 4
            from ..report.fit import fit as fit_of

            status.update(f"checking B={batch} within the budget ...")
            whole = named if dims else report
            fit = fit_of(report, batch, budget_bytes, cudnn_workspace=conv_ws,
                         named=whole if dims else None, dims=at_dims, ranks_ahead=ranks,
                         limit=position_limit(t.model) if dims else None,
                         reanalyze=reanalyze_of(whole), jobs=jobs, ahead=ahead,
                         progress=lambda what:
                         status.update(f"B={batch} does not fit; finding {what} ..."),
                         meanwhile=None if whatif else lambda: early.update(s=summary()),
                         idle=None if whatif else early_parts)
        rows = ()
        if whatif:
            from ..whatif import whatif as whatifs

            status.update("answering the what-ifs ...")
            rows = whatifs(t.model, xs, ys, step=step, B=batch, budget_bytes=budget_bytes,
                           batch_dim=where, parallel=parallel,
                           amp=torch.float16 if device == "cuda" else torch.bfloat16)
    s = replace(early["s"], fit=fit.as_dict()) if early else summary(whatifs=rows, fit=fit)
    return _render(s, fmt, exact_formula), fit


def with_foreach(cls, name: str, foreach: bool):
    """The optimizer class ``cls`` (``--optimizer name``) with ``foreach=`` set, for
    ``--foreach``/``--no-foreach``.

    >>> with_foreach(torch.optim.AdamW, "adamw", False).keywords
    {'foreach': False}
    """
    flag = "--foreach" if foreach else "--no-foreach"
    if cls is None:
        raise InputError(f"{flag} sets the optimizer's foreach=: give --optimizer")
    if "foreach" not in inspect.signature(cls).parameters:
        raise InputError(f"--optimizer {name} has no foreach implementation (torch.optim."
                         f"{cls.__name__} takes no foreach=): drop {flag}")
    return functools.partial(cls, foreach=foreach)


def _check_inference(optimizer, checkpoint, targets, loss, grad_accum, whatif) -> None:
    """What an --inference step (forward only, under no_grad) cannot take."""
    drop = [o for o, given in (("--optimizer", optimizer != "none"),
                               ("--checkpoint", checkpoint != "none"),
                               ("--target", bool(targets)), ("--loss", loss is not None),
                               ("--grad-accum", grad_accum != 1)) if given]
    if whatif:
        raise InputError("--whatif compares training setups within a budget: give --budget "
                         "(and no --inference)")
    if drop:
        raise InputError(f"--inference runs no backward pass (nor a loss): drop {drop[0]}")


def _card(gpu, cuda_context, budget_bytes, device):
    """The card named by --gpu and the CUDA context's bytes (None, None without --gpu)."""
    from ..device.gpus import gpu as lookup
    from .targets import parse_size

    if gpu is None:
        if cuda_context is not None:
            raise InputError("--cuda-context is subtracted from a card's capacity: give --gpu")
        return None, None
    if device != "cuda":
        raise InputError("--gpu answers for a CUDA card: drop --device cpu")
    if budget_bytes is not None:
        raise InputError("give --gpu (the card's capacity less the CUDA context) or --budget "
                         "(the bytes the allocator can get), not both")
    return lookup(gpu), parse_size(cuda_context) if cuda_context is not None else None


def _render(s, fmt: str, exact_formula: bool = False):
    """The summary in ``fmt``; the HTML renderer imported only when asked for (it imports
    matplotlib, which the other formats do not need)."""
    from ..report import jsonout, markdown, terminal

    if fmt == "table":
        return terminal.render_terminal(s, exact=exact_formula)
    if fmt == "html":
        from ..report.html import render_html

        return render_html(s)
    return {"json": jsonout.render_json, "md": markdown.render_markdown}[fmt](s)


def argv_first_is_target(argv) -> bool:
    """Whether the first argument looks like a model (``file.py:Net``, ``hf:gpt2``) rather
    than a command."""
    args = sys.argv[1:] if argv is None else list(argv)
    return bool(args) and ":" in args[0]


def main(argv=None):
    """Entry point of the ``fxmem`` console script: click's usage errors become one line
    too (exit 2)."""
    try:
        code = cli.main(args=argv, prog_name="fxmem", standalone_mode=False)
    except click.UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `fxmem`: the help, as --help
            click.echo(e.ctx.get_help())
            sys.exit(0)
        where = f"fxmem {e.ctx.info_name} --help" if e.ctx and e.ctx.parent else "fxmem --help"
        msg = e.format_message()
        if msg.startswith("No such command") and argv_first_is_target(argv):
            msg += " A model is analysed with: fxmem analyze TARGET ..."
        click.echo(f"fxmem: error: {msg} (see {where})", err=True)
        sys.exit(EXIT_USAGE)
    except click.ClickException as e:
        click.echo(f"fxmem: error: {e.format_message()}", err=True)
        sys.exit(e.exit_code)
    except (click.Abort, KeyboardInterrupt):
        click.echo("fxmem: error: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(code if isinstance(code, int) else 0)
