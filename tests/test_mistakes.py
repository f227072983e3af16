"""A user's mistakes, one row each: through the command line, exactly one line on stderr
naming what was wrong and what to do, the documented exit code (2 usage, 3 cannot trace; a
budget nothing fits is no mistake: tests/test_fit.py), no traceback, no torch log line,
nothing on stdout, no --out file; through the API, the FxmemError subclass with a one-line message. No message shows the ShapeEnv's
names (s44, u0), and no row changes global state (logging levels, warnings filters, torch's
default dtype and device, dispatch modes).

Command rows run in-process (``fxmem.cli.main``, stdout and stderr captured at the file
descriptors, so torch's log handlers are caught too); a few run as ``python -m fxmem``."""

import contextlib
import logging
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

import fxmem
from fxmem.trace.engine.messages import has_internal_symbol

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
M = os.path.join(HERE, "mistakes_models", "user_models.py")
J = os.path.join(HERE, "mistakes_models")
SEED = os.path.join(ROOT, "examples", "seed_convnet.py")
CPU = ["--device", "cpu"]
NET = ["analyze", f"{M}:Net", "--input", "B,4", "--target", "B:int64:3", *CPU]
GPT2 = ["analyze", "hf:gpt2", "--config", "n_layer=1", *CPU]
TORCH_LOG = re.compile(r"^[EWIDC]\d{4} ", re.M)


def _line(path: str, text: str) -> str:
    """``file:line`` of the first line of ``path`` containing ``text``."""
    with open(path, encoding="utf-8") as f:
        n = next(i for i, line in enumerate(f, 1) if text in line)
    return f"{os.path.basename(path)}:{n}"


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """Files a user might point at that cannot be kept in the repository as Python."""
    d = tmp_path_factory.mktemp("broken")
    (d / "syntax_error.py").write_text("import torch\nclass Net(torch.nn.Module:\n    pass\n")
    (d / "import_error.py").write_text("import torch\nimport nosuchpackage_xyz\n")
    (d / "raises_at_import.py").write_text("import torch\nraise ValueError('boom')\n")
    (d / "model.txt").write_text("class Net: pass\n")
    (d / "cfgdir.json").mkdir()
    return d


# (id, argv, exit code, words the message contains); {tmp}: the broken-files folder,
# {out}: a fresh --out path whose file must not exist afterwards
CLI = [
    # the issue's own
    ("dir_as_file", ["analyze", "{tmp}:Net", "--input", "B,3", *CPU], 2, ["not a Python file"]),
    ("syntax_error", ["analyze", "{tmp}/syntax_error.py:Net", "--input", "B,4", *CPU], 2,
     ["SyntaxError", "syntax_error.py:2"]),
    ("import_error", ["analyze", "{tmp}/import_error.py:Net", "--input", "B,4", *CPU], 2,
     ["nosuchpackage_xyz", "import_error.py:2"]),
    ("raises_at_import", ["analyze", "{tmp}/raises_at_import.py:Net", "--input", "B,4", *CPU],
     2, ["ValueError: boom", "raises_at_import.py:2"]),
    ("negative_dim", ["analyze", f"{SEED}:SimpleConvNet", "--input", "B,-3,32,32", *CPU], 2,
     ["dim 1 is -3", "positive"]),
    ("zero_dim", ["analyze", f"{SEED}:SimpleConvNet", "--input", "B,0,32,32", *CPU], 2,
     ["dim 1 is 0", "positive"]),
    ("hf_config_value_type", ["analyze", "hf:gpt2", "--config", "n_layer=abc", *CPU], 2,
     ["n_layer", "integer"]),
    ("hf_seq_past_positions", [*GPT2[:4], "--seq", "5000", *CPU], 2,
     ["5000", "1024 positions", "--seq"]),
    ("out_folder_missing", ["analyze", f"{M}:Branchy", "--input", "B,4", *CPU, "--out",
                            "/nonexistent-fxmem/r.html"], 2, ["no such folder", "/nonexistent"]),
    ("wrong_image_size", ["analyze", f"{SEED}:SimpleConvNet", "--input", "B,3,64,64",
                          "--target", "B:int64:10", *CPU], 3,
     ["aten.addmm", "module fc", _line(SEED, "return self.fc(x)"), "[B, "]),
    ("output_not_a_loss", ["analyze", f"{SEED}:SimpleConvNet", "--input", "B,3,32,32", *CPU],
     2, ["(B, 10)", "loss"]),
    ("high_negative", [*NET[:4], "--target", "B:int64:-10", *CPU], 2,
     ["positive integer", "[0, HIGH)"]),
    ("data_dependent_branch", ["analyze", f"{M}:Branchy", "--input", "B,4", "--target", "B,4",
                               "--loss", "mse", *CPU], 3,
     ["module (root)", _line(M, "if h.sum() > 0")]),
    ("validate_unknown_case", ["validate", "--only", "nosuch", *CPU], 2,
     ["no validation case 'nosuch'", "closest"]),
    ("dtype_unknown", ["analyze", f"{M}:Net", "--input", "B,4:float7", *CPU], 2,
     ["unknown dtype 'float7'", "float16 (fp16, half)", "bfloat16 (bf16)"]),
    ("amp_unknown", [*NET, "--amp", "fp32"], 2, ["--amp", "float16 (fp16, half)"]),
    # targets and model files
    ("target_without_colon", ["analyze", "justaname", *CPU], 2, ["TARGET is"]),
    ("target_no_name", ["analyze", f"{M}:", "--input", "B,4", *CPU], 2, ["TARGET is"]),
    ("target_no_file", ["analyze", ":Net", "--input", "B,4", *CPU], 2, ["TARGET is"]),
    ("no_such_file", ["analyze", "nope.py:Net", "--input", "B,4", *CPU], 2,
     ["no such file: nope.py"]),
    ("not_python_file", ["analyze", "{tmp}/model.txt:Net", "--input", "B,4", *CPU], 2,
     ["not a Python file"]),
    ("misspelt_class", ["analyze", f"{M}:Nett", "--input", "B,4", *CPU], 2,
     ["has no Nett", "did you mean Net"]),
    ("module_import_fails", ["analyze", "nosuchpkg_xyz.mod:Net", "--input", "B,4", *CPU], 2,
     ["cannot import nosuchpkg_xyz.mod"]),
    ("not_callable", ["analyze", f"{M}:CONSTANT", "--input", "B,4", *CPU], 2,
     ["not a class or factory"]),
    ("factory_not_module", ["analyze", f"{M}:not_a_module", "--input", "B,4", *CPU], 2,
     ["made a int", "not a torch.nn.Module"]),
    ("constructor_raises", ["analyze", f"{M}:Fails", "--input", "B,4", *CPU], 2,
     ["cannot build", "cannot build this one", _line(M, 'raise RuntimeError("cannot build')]),
    ("constructor_needs_args", ["analyze", f"{M}:NeedsArgs", "--input", "B,4", *CPU], 2,
     ["cannot build", "'n'"]),
    ("unknown_family_timm", ["analyze", "timm:nosuch_model", *CPU], 2, ["timm"]),
    ("unknown_family_torchvision", ["analyze", "torchvision:nosuch_model", *CPU], 2,
     ["torchvision"]),
    # --config
    ("config_misspelt_param", [*NET, "--config", "widht=3"], 2, ["widht", "did you mean width"]),
    ("config_value_unusable", [*NET, "--config", "width=abc"], 2,
     ["cannot build", _line(M, "self.fc = nn.Linear(4, width)")]),
    ("config_given_twice", [*NET, "--config", "width=3", "--config", "width=4"], 2,
     ["width is given twice"]),
    ("config_without_equals", [*NET, "--config", "width"], 2, ["--config takes key=value"]),
    ("config_empty_key", [*NET, "--config", "=4"], 2, ["--config takes key=value"]),
    # Hugging Face
    ("hf_unknown_preset", ["analyze", "hf:nosuch", *CPU], 2, ["unknown preset hf:nosuch"]),
    ("hf_config_misspelt", ["analyze", "hf:gpt2", "--config", "n_layr=1", *CPU], 2,
     ["did you mean n_layer"]),
    ("hf_config_bool_for_int", ["analyze", "hf:gpt2", "--config", "n_layer=true", *CPU], 2,
     ["n_layer", "integer"]),
    ("hf_config_float_for_int", ["analyze", "hf:llama", "--config", "num_hidden_layers=1.5",
                                 *CPU], 2, ["num_hidden_layers", "integer"]),
    ("hf_config_cannot_build", [*GPT2, "--config", "n_embd=64"], 2,
     ["cannot build GPT2LMHeadModel", "divisible"]),
    ("hf_json_missing", ["analyze", "hf:{tmp}/missing.json", *CPU], 2,
     ["no such config file"]),
    ("hf_json_invalid", ["analyze", f"hf:{J}/bad_json.json", *CPU], 2,
     ["not valid JSON", "line 2"]),
    ("hf_json_not_object", ["analyze", f"hf:{J}/list.json", *CPU], 2,
     ["JSON list", "not an object"]),
    ("hf_json_no_model_type", ["analyze", f"hf:{J}/no_model_type.json", *CPU], 2,
     ["no model_type"]),
    ("hf_json_unknown_model_type", ["analyze", f"hf:{J}/unknown_model_type.json", *CPU], 2,
     ["no model_type 'gpt3'", "did you mean"]),
    ("hf_json_is_folder", ["analyze", "hf:{tmp}/cfgdir.json", *CPU], 2, ["not a file"]),
    ("hf_dim_past_positions", [*GPT2, "--dim", "L=5000"], 2, ["L=5000", "1024 positions"]),
    ("hf_fixed_length_past_positions", [*GPT2, "--input", "B,2000:int64:50257", "--input",
                                        "B,2000:int64:50257"], 2, ["2000", "1024 positions"]),
    ("hf_target_with_own_loss", [*GPT2, "--seq", "8", "--target", "B:int64:10"], 2,
     ["--target goes nowhere"]),
    ("seq_on_a_file_target", [*NET, "--seq", "12"], 2, ["--seq", "--dim L="]),
    # tensor specs
    ("input_missing", ["analyze", f"{M}:Net", *CPU], 2, ["give the model's inputs"]),
    ("input_empty", ["analyze", f"{M}:Net", "--input", "", *CPU], 2, ["bad tensor spec ''"]),
    ("input_fractional_dim", ["analyze", f"{M}:Net", "--input", "B,4.5", *CPU], 2,
     ["dims are integers"]),
    ("input_too_many_colons", ["analyze", f"{M}:Net", "--input", "B,4:float32:10:3", *CPU], 2,
     ["too many ':'"]),
    ("high_not_a_number", [*NET[:4], "--target", "B:int64:abc", *CPU], 2,
     ["HIGH must be a positive integer"]),
    ("high_zero", [*NET[:4], "--target", "B:int64:0", *CPU], 2, ["HIGH must be a positive"]),
    ("high_on_a_float", [*NET[:4], "--target", "B,3:float32:10", "--loss", "mse", *CPU], 2,
     ["HIGH is for integer tensors"]),
    ("target_dtype_unknown", [*NET[:4], "--target", "B:int65:3", *CPU], 2,
     ["unknown dtype 'int65'"]),
    ("batch_twice", ["analyze", f"{M}:Net", "--input", "B,4,B", *CPU], 2,
     ["one dim only"]),
    ("batch_nowhere", ["analyze", f"{M}:Net", "--input", "4,4", *CPU], 2,
     ["no --input/--target spec has B"]),
    # --dim
    ("dim_unused", [*NET, "--dim", "L=5"], 2, ["--dim L is not used"]),
    ("dim_size_missing", ["analyze", f"{M}:Net", "--input", "B,L", *CPU], 2, ["--dim L=SIZE"]),
    ("dim_zero", ["analyze", f"{M}:Net", "--input", "B,L", "--dim", "L=0", *CPU], 2,
     ["L=0", "positive integer"]),
    ("dim_not_a_number", ["analyze", f"{M}:Net", "--input", "B,L", "--dim", "L=abc", *CPU], 2,
     ["L=abc", "positive integer"]),
    ("dim_without_equals", ["analyze", f"{M}:Net", "--input", "B,L", "--dim", "L", *CPU], 2,
     ["--dim takes key=value"]),
    ("dim_is_the_batch", [*NET, "--dim", "B=4"], 2, ["B is the batch size", "--batch"]),
    ("dim_given_twice", ["analyze", f"{M}:Net", "--input", "B,L", "--dim", "L=3", "--dim",
                         "L=4", *CPU], 2, ["L is given twice"]),
    # --budget
    ("budget_words", [*NET, "--budget", "lots"], 2, ["not a size: 'lots'", "GiB"]),
    ("budget_zero", [*NET, "--budget", "0"], 2, ["--budget 0", "positive"]),
    ("budget_negative", [*NET, "--budget", "-5GB"], 2, ["not a size: '-5GB'"]),
    ("budget_unknown_unit", [*NET, "--budget", "8G"], 2, ["not a size: '8G'", "units"]),
    ("gpu_unknown", [*NET[:6], "--gpu", "H200"], 2, ["unknown GPU 'H200'", "H100-80GB"]),
    ("gpu_with_cpu", [*NET, "--gpu", "H100-80GB"], 2, ["--gpu", "drop --device cpu"]),
    # data parallelism
    ("fsdp_option_without_fsdp", [*NET, "--no-reshard"], 2, ["--no-reshard", "--fsdp"]),
    ("fsdp_dtype_without_fsdp", [*NET, "--param-dtype", "bf16"], 2, ["--param-dtype", "--fsdp"]),
    ("fsdp_zero", [*NET, "--fsdp", "0"], 2, ["--fsdp"]),
    ("fsdp_int_dtype", [*NET, "--fsdp", "2", "--param-dtype", "int8"], 2, ["param_dtype",
                                                                            "floating"]),
    ("fsdp_bad_dtype", [*NET, "--fsdp", "2", "--reduce-dtype", "fp13"], 2, ["--reduce-dtype",
                                                                             "fp13"]),
    # a budget nothing fits (exit 4) is no mistake: the report comes (tests/test_fit.py)
    ("fsdp_and_ddp", [*NET, "--fsdp", "2", "--ddp", "2"], 2, ["--fsdp or --ddp", "not both"]),
    ("zero1_without_ddp", [*NET, "--zero1"], 2, ["--zero1", "give --ddp"]),
    ("tp_plan_without_tp", [*NET, "--tp-plan", f"{M}:Net"], 2, ["--tp-plan", "give --tp"]),
    ("tp_with_ddp", [*NET, "--tp", "2", "--ddp", "2"], 2, ["--tp composes with --fsdp"]),
    ("tp_without_a_plan", [*NET, "--tp", "2"], 2, ["Net has no tensor-parallel plan",
                                                    "give --tp-plan FILE.py:NAME"]),
    ("tp_gpt2_has_no_plan", [*GPT2, "--tp", "2"], 2, ["GPT2LMHeadModel has no tensor-parallel",
                                                      "Hugging Face gives it none"]),
    ("tp_plan_not_a_dict", [*NET, "--tp", "2", "--tp-plan", f"{M}:Net"], 2,
     ["--tp-plan", "is a type, not a dict"]),
    ("tp_plan_no_such_name", [*NET, "--tp", "2", "--tp-plan", f"{M}:PLAN"], 2, ["has no PLAN"]),
    ("tp_zero", [*NET, "--tp", "0"], 2, ["--tp"]),
    ("replicate_without_fsdp", [*NET, "--replicate", "2"], 2, ["--replicate", "--fsdp"]),
    ("offload_with_ddp", [*NET, "--ddp", "2", "--offload"], 2, ["--offload", "give --fsdp"]),
    ("replicate_not_a_divisor", [*NET, "--fsdp", "4", "--replicate", "3"], 2,
     ["--replicate is the number of HSDP replicas", "a divisor of the world size 4"]),
    # --whatif with --fsdp/--ddp works (test_whatif_with_a_parallel_step); a budget it needs
    ("ddp_whatif_without_budget", [*NET, "--ddp", "2", "--whatif"], 2,
     ["--whatif", "give --budget"]),
    ("gpu_and_budget", [*NET[:6], "--gpu", "H100-80GB", "--budget", "8GiB"], 2,
     ["--gpu", "--budget", "not both"]),
    ("cuda_context_without_gpu", [*NET[:6], "--cuda-context", "1GiB"], 2, ["give --gpu"]),
    ("cuda_context_not_a_size", [*NET[:6], "--gpu", "T4", "--cuda-context", "lots"], 2,
     ["not a size: 'lots'"]),
    ("cuda_context_past_capacity", [*NET[:6], "--gpu", "T4", "--cuda-context", "100GiB"], 2,
     ["CUDA context", "T4"]),
    # plans and steps
    ("checkpoint_misspelt", [*NET, "--checkpoint", "fcc"], 2, ["no submodule 'fcc'",
                                                              "did you mean 'fc'"]),
    ("checkpoint_empty", [*NET, "--checkpoint", ","], 2, ["--checkpoint takes auto"]),
    ("checkpoint_plan_file_missing", [*NET, "--checkpoint", "no-such-plan.json"], 2,
     ["cannot read the checkpoint plan", "no-such-plan.json"]),
    ("checkpoint_with_inference", ["analyze", f"{M}:Net", "--input", "B,4", "--inference",
                                   "--checkpoint", "auto", *CPU], 2,
     ["--inference", "drop --checkpoint"]),
    ("inference_with_optimizer", ["analyze", f"{M}:Net", "--input", "B,4", "--inference",
                                  "--optimizer", "adam", *CPU], 2, ["drop --optimizer"]),
    ("inference_with_target", [*NET, "--inference"], 2, ["drop --target"]),
    ("inference_with_grad_accum", ["analyze", f"{M}:Net", "--input", "B,4", "--inference",
                                   "--grad-accum", "2", *CPU], 2, ["drop --grad-accum"]),
    ("whatif_without_budget", [*NET, "--whatif"], 2, ["--whatif", "give --budget"]),
    ("whatif_with_inference", ["analyze", f"{M}:Net", "--input", "B,4", "--inference",
                               "--whatif", "--budget", "1GiB", *CPU], 2, ["--whatif"]),
    ("lbfgs_with_grad_accum", [*NET, "--optimizer", "lbfgs", "--grad-accum", "2"], 2,
     ["LBFGS", "grad_accum"]),
    ("loss_without_target", ["analyze", f"{M}:Net", "--input", "B,4", "--loss",
                             "cross_entropy", *CPU], 2, ["give --target"]),
    ("loss_none_with_target", [*NET, "--loss", "none"], 2, ["--target goes nowhere"]),
    # options click checks
    ("batch_zero", [*NET, "--batch", "0"], 2, ["--batch", "0 is not in the range"]),
    ("grad_accum_zero", [*NET, "--grad-accum", "0"], 2, ["--grad-accum"]),
    ("top_zero", [*NET, "--top", "0"], 2, ["--top"]),
    ("format_pdf", [*NET, "--format", "pdf"], 2, ["--format", "'pdf'"]),
    ("device_tpu", [*NET[:6], "--device", "tpu"], 2, ["--device", "'tpu'"]),
    ("loss_unknown", [*NET, "--loss", "hinge"], 2, ["--loss", "'hinge'"]),
    ("optimizer_unknown", [*NET, "--optimizer", "adamx"], 2, ["--optimizer", "'adamx'"]),
    ("option_unknown", [*NET, "--bogus"], 2, ["No such option '--bogus'"]),
    ("command_misspelt", ["analyse", *NET[1:]], 2, ["No such command 'analyse'", "analyze"]),
    ("target_argument_missing", ["analyze"], 2, ["Missing argument 'TARGET'"]),
    ("capability_too_old", [*NET[:6], "--compute-capability", "2.0"], 2,
     ["compute_capability", "(2, 0)"]),
    ("capability_not_a_number", [*NET[:6], "--compute-capability", "abc"], 2,
     ["not a compute capability"]),
    ("capability_with_cpu", [*NET, "--compute-capability", "8.0"], 2,
     ["--compute-capability", "--device cpu"]),
    ("cudnn_workspace_with_cpu", [*NET, "--cudnn-workspace", "1MiB"], 2,
     ["--cudnn-workspace is a CUDA figure"]),
    ("cudnn_workspace_not_a_size", [*NET[:6], "--cudnn-workspace", "lots"], 2,
     ["not a size: 'lots'"]),
    ("out_is_a_folder", [*NET, "--out", "{tmp}"], 2, ["is a directory"]),
    ("validate_out_folder_missing", ["validate", "--only", "nosuch", *CPU, "--out-md",
                                     "/nonexistent-fxmem/v.md"], 2, ["no such folder"]),
    ("validate_case_incomplete", ["validate", "--only", "seed CNN", *CPU], 2,
     ["no validation case 'seed CNN'", "'seed CNN, fp32, Adam'"]),
    # models that cannot be traced, and why
    ("trace_fails_no_out_file", ["analyze", f"{M}:Branchy", "--input", "B,4", "--target",
                                 "B,4", "--loss", "mse", *CPU, "--out", "{out}"], 3,
     ["branches on a value read from a tensor"]),
    ("too_few_inputs", ["analyze", f"{M}:Two", "--input", "B,4", "--target", "B:int64:3",
                        *CPU], 3, ["Two.forward(x, y) takes 2 inputs, got 1",
                                   _line(M, "def forward(self, x, y)")]),
    ("too_many_inputs", [*NET[:4], "--input", "B,4", *NET[4:]], 3,
     ["Net.forward(x) takes 1 input, got 2"]),
    ("float_ids_into_embedding", ["analyze", f"{M}:Emb", "--input", "B,5", "--target",
                                  "B:int64:3", *CPU], 3,
     ["aten.embedding", "module emb", "integer dtype", _line(M, "self.emb(ids)")]),
    ("wrong_feature_size", ["analyze", f"{M}:Net", "--input", "B,5", "--target", "B:int64:3",
                            *CPU], 3, ["[B, 5]", "module fc", _line(M, "self.head(torch.relu")]),
    ("two_targets_for_cross_entropy", [*NET, "--target", "B:int64:3"], 3,
     ["the loss cross_entropy", "(B, 3) float32", "during loss"]),
    ("mse_with_class_indices", [*NET, "--loss", "mse"], 3,
     ["the loss mse_loss", "(B,) int64"]),
    ("mse_with_wrong_shape", [*NET[:4], "--target", "B,7", "--loss", "mse", *CPU], 3,
     ["the loss mse_loss", "(B, 7) float32"]),
    ("nothing_to_train", ["analyze", f"{M}:NoParams", "--input", "B,4", "--target", "B,4",
                          "--loss", "mse", *CPU], 2, ["no parameter that requires grad",
                                                      "--inference"]),
    ("forward_raises", ["analyze", f"{M}:Raises", "--input", "B,4", "--target", "B:int64:3",
                        *CPU], 3, ["my own bug", _line(M, 'raise ValueError("my own bug")')]),
    ("branch_on_a_count", ["analyze", f"{M}:MaskBranch", "--input", "B,4", "--target", "B,4",
                           "--loss", "mse", *CPU], 3,
     ["True values of a mask of 4*B elements", _line(M, "if picked.shape[0] > 3")]),
    ("branch_in_a_submodule", ["analyze", f"{M}:Nested", "--input", "B,4", "--target", "B,4",
                               "--loss", "mse", *CPU], 3,
     ["module inner.1", _line(M, "if x.mean() > 0")]),
    ("output_sized_by_data", ["analyze", f"{M}:MaskOut", "--input", "B,4", *CPU], 2,
     ["(n,)", "n: the number of True values"]),
    ("batch_size_a_constant", ["analyze", f"{M}:FixedBatch", "--input", "B,4", "--target",
                               "B:int64:3", *CPU], 3,
     ["specialized to 8", _line(M, "view(8, 3)")]),
    ("named_dim_in_a_message", ["analyze", f"{M}:Tokens", "--input", "B,L:int64:10", "--dim",
                                "L=6", *CPU], 3, ["[L*B, 4]", "module fc"]),
    ("size_read_from_a_value", ["analyze", f"{M}:SizedByAValue", "--input", "B,4", *CPU], 3,
     ["a value read from a tensor", "no bound", _line(M, "torch.ones(n.item()")]),
    ("model_made_with_config", ["analyze", f"{M}:made", "--input", "B,4", "--config",
                                "width=3", *CPU], 2, ["a model already made"]),
    ("file_without_py", ["analyze", f"{M[:-3]}:Net", "--input", "B,4", *CPU], 2,
     ["no such file", "did you mean", "user_models.py:Net"]),
    ("batch_in_lower_case", ["analyze", f"{M}:Net", "--input", "b,4", *CPU], 2,
     ["the batch is B, upper case"]),
]
# rows also run as a real process (python -m fxmem)
SUBPROCESS = {"wrong_image_size", "dir_as_file", "trace_fails_no_out_file"}


def _torch_levels() -> dict:
    return {n: lg.level for n, lg in logging.Logger.manager.loggerDict.items()
            if isinstance(lg, logging.Logger) and (n == "torch" or n.startswith("torch."))}


def _state():
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    key = torch._C._TorchDispatchModeKey
    return (torch.get_default_dtype(), torch.get_default_device(), _torch_levels(),
            logging.root.manager.disable, list(warnings.filters),
            len(_get_current_dispatch_mode_stack()),
            torch._C._get_dispatch_mode(key.FAKE), torch._C._get_dispatch_mode(key.PROXY))


def _unchanged(before, after) -> bool:
    """Global state as it was; loggers made since (modules imported) are new, not changed."""
    levels = {n: after[2].get(n) for n in before[2]}
    return (*before[:2], *before[3:]) == (*after[:2], *after[3:]) and levels == before[2]


def _argv(argv, broken, out):
    return [a.replace("{tmp}", str(broken)).replace("{out}", str(out)) for a in argv]


def _check_cli(code, stdout, stderr, want_code, words, out):
    assert code == want_code, (code, stderr)
    assert stdout == "", stdout
    assert stderr.endswith("\n") and stderr.count("\n") == 1, stderr
    assert stderr.startswith("fxmem: error: "), stderr
    assert "Traceback" not in stderr and not TORCH_LOG.search(stderr), stderr
    assert not has_internal_symbol(stderr), stderr
    for w in words:
        assert w in stderr, (w, stderr)
    assert not os.path.exists(out), "a failed command left its --out file"


class _Records(logging.Handler):
    def __init__(self, into):
        super().__init__(logging.NOTSET)
        self.into = into

    def emit(self, record):
        self.into.append(record.getMessage())


@contextlib.contextmanager
def _log_records():
    """The messages every logger with a handler of its own would print (torch's keep the
    stream they were made with, which the capture fixtures do not see)."""
    records: list = []
    handler = _Records(records)
    loggers = [logging.getLogger()] + [  # (torch.__trace: TORCH_TRACE's files, not stderr)
        lg for n, lg in list(logging.Logger.manager.loggerDict.items())
        if isinstance(lg, logging.Logger) and lg.handlers and n != "torch.__trace"]
    for lg in loggers:
        lg.addHandler(handler)
    try:
        yield records
    finally:
        for lg in loggers:
            lg.removeHandler(handler)


def run_in_process(argv, capfd):
    """``fxmem ARGV`` in this process: (exit code, stdout, stderr), with every warning
    shown (a leaked one would be on stderr) and global state checked unchanged."""
    from fxmem.cli import main

    capfd.readouterr()
    with warnings.catch_warnings(), _log_records() as records:
        warnings.resetwarnings()
        warnings.simplefilter("always")
        before = _state()
        try:
            main(argv)
            code = 0
        except SystemExit as e:
            code = e.code
        assert _unchanged(before, _state()), "the command changed global state"
    out, err = capfd.readouterr()
    assert records == [], f"log lines: {records}"
    return code, out, err


@pytest.mark.parametrize("argv, code, words", [pytest.param(*r[1:], id=r[0]) for r in CLI])
def test_a_mistake_on_the_command_line(argv, code, words, broken, tmp_path, capfd):
    out = tmp_path / "report.out"
    got = run_in_process(_argv(argv, broken, out), capfd)
    _check_cli(*got, code, words, out)


@pytest.mark.parametrize("row", [r for r in CLI if r[0] in SUBPROCESS], ids=lambda r: r[0])
def test_a_mistake_in_a_real_process(row, broken, tmp_path):
    _, argv, code, words = row
    out = tmp_path / "report.out"
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-m", "fxmem", *_argv(argv, broken, out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env=env)
    _check_cli(r.returncode, r.stdout, r.stderr, code, words, out)


@pytest.mark.parametrize("flag", ["--fsdp", "--ddp"])
def test_auto_checkpoint_with_a_parallel_step(flag, capfd):
    """``--checkpoint auto`` with ``--fsdp``/``--ddp`` (once refused) chooses one plan for
    every rank: the report shows it, its frontier and each group's peak with it."""
    import json

    code, out, err = run_in_process([*NET, flag, "2", "--checkpoint", "auto", "--budget",
                                     "1GiB", "--format", "json"], capfd)
    assert code == 0 and err == "", err
    doc = json.loads(out)
    assert doc["setup"]["checkpoint"] == "auto" and doc["frontier"]
    assert "plan" in doc and max(r["peak_bytes"] for r in doc["ranks"]) == doc["peak_bytes"]


def test_the_rows_are_many_and_distinct():
    ids = [r[0] for r in CLI] + [r[0] for r in API]
    assert len(ids) == len(set(ids)) and len(ids) >= 120


# --- the API ----------------------------------------------------------------------------------

sys.path.insert(0, J)
import user_models as mm  # noqa: E402 - tests/mistakes_models/user_models.py

X, Y = torch.randn(8, 4), torch.randint(0, 3, (8,))
_reports: dict = {}


def _report():
    if "r" not in _reports:
        _reports["r"] = fxmem.analyze(mm.Net(), X, Y, loss=F.cross_entropy, device="cpu")
    return _reports["r"]


def _sum(o):
    return o.sum()


def _analyze(model, *args, **kw):
    return lambda: fxmem.analyze(model, *args, **{"device": "cpu", **kw})


API = [
    ("api_not_a_module", lambda: fxmem.analyze("model", X), fxmem.InputError,
     ["torch.nn.Module", "str"]),
    ("api_region_of_a_string", lambda: fxmem.Region("fc1"), fxmem.InputError,
     ["tuple of module paths", "('fc1',)"]),
    ("api_plan_json_not_a_plan", lambda: fxmem.load_plan('{"plan": ["fc1"]}'),
     fxmem.InputError, ["not an fxmem checkpoint plan"]),
    ("api_inputs_not_tensors", _analyze(mm.Net(), [[1, 2]]), fxmem.InputError,
     ["inputs[0] is a list, not a tensor"]),
    ("api_inputs_a_dict", _analyze(mm.Net(), {"x": X}), fxmem.InputError, ["got dict"]),
    ("api_loss_not_callable", _analyze(mm.Net(), X, Y, loss="ce"), fxmem.InputError,
     ["loss must be callable"]),
    ("api_optimizer_a_name", _analyze(mm.Net(), X, Y, loss=F.cross_entropy, optimizer="adam"),
     fxmem.InputError, ["optimizer must be"]),
    ("api_device_unknown", _analyze(mm.Net(), X, Y, loss=F.cross_entropy, device="tpu"),
     fxmem.InputError, ["device must be 'cpu' or 'cuda'"]),
    ("api_amp_float32", _analyze(mm.Net(), X, Y, loss=F.cross_entropy, amp=torch.float32),
     fxmem.InputError, ["amp is torch.bfloat16 or torch.float16", "bf16"]),
    ("api_amp_unknown_name", _analyze(mm.Net(), X, Y, loss=F.cross_entropy, amp="fp8"),
     fxmem.InputError, ["'fp8'", "float16 (fp16, half)"]),
    ("api_grad_accum_zero", _analyze(mm.Net(), X, Y, loss=F.cross_entropy, grad_accum=0),
     fxmem.InputError, ["grad_accum must be a positive int"]),
    ("api_option_unknown", _analyze(mm.Net(), X, Y, loss=F.cross_entropy, bogus=1),
     fxmem.InputError, ["unknown step option bogus"]),
    ("api_checkpoint_a_string", _analyze(mm.Net(), X, Y, loss=F.cross_entropy,
                                         checkpoint="fc"), fxmem.InputError, ["write ['fc']"]),
    ("api_checkpoint_no_such_module", _analyze(mm.Net(), X, Y, loss=F.cross_entropy,
                                               checkpoint=["fcc"]), fxmem.InputError,
     ["no submodule 'fcc'", "did you mean 'fc'"]),
    ("api_dims_no_such_tensor", _analyze(mm.Net(), X, Y, loss=F.cross_entropy,
                                         dims={"L": [(5, 1)]}), fxmem.InputError,
     ["tensor 5 does not exist"]),
    ("api_dims_no_such_dim", _analyze(mm.Net(), X, Y, loss=F.cross_entropy,
                                      dims={"L": [(0, 3)]}), fxmem.InputError,
     ["no such dim at dim 3"]),
    ("api_dims_named_B", _analyze(mm.Net(), X, Y, loss=F.cross_entropy, dims={"B": [(0, 1)]}),
     fxmem.InputError, ["other than B"]),
    ("api_batch_dim_out_of_range", _analyze(mm.Net(), X, Y, loss=F.cross_entropy,
                                            batch_dim=5), fxmem.InputError,
     ["batch_dim=5 is out of range", "(8, 4)"]),
    ("api_batch_dim_one_per_tensor", _analyze(mm.Net(), X, Y, loss=F.cross_entropy,
                                              batch_dim=(0,)), fxmem.InputError,
     ["batch_dim has 1 entry; it needs 2"]),
    ("api_batch_dim_a_name", _analyze(mm.Net(), X, Y, loss=F.cross_entropy, batch_dim="x"),
     fxmem.InputError, ["batch_dim is an int"]),
    ("api_batch_hint_negative", _analyze(mm.Net(), X, Y, loss=F.cross_entropy, batch_hint=-1),
     fxmem.InputError, ["batch_hint must be a positive int"]),
    ("api_batch_hint_float", _analyze(mm.Net(), X, Y, loss=F.cross_entropy, batch_hint=2.5),
     fxmem.InputError, ["batch_hint"]),
    ("api_batches_differ", _analyze(mm.Net(), X, Y[:5], loss=F.cross_entropy),
     fxmem.InputError, ["the batch dim's size differs"]),
    ("api_input_0_dimensional", _analyze(mm.Net(), torch.tensor(1.0), loss=_sum),
     fxmem.InputError, ["0-dimensional"]),
    ("api_targets_without_loss", _analyze(mm.Net(), X, Y), fxmem.InputError,
     ["no loss function"]),
    ("api_nothing_to_train", _analyze(mm.NoParams(), X, loss=_sum), fxmem.InputError,
     ["no parameter that requires grad"]),
    ("api_too_few_inputs", _analyze(mm.Two(), X, loss=_sum), fxmem.TraceError,
     ["Two.forward(x, y)", "got 1"]),
    ("api_wrong_feature_size", _analyze(mm.Net(), torch.randn(8, 5), loss=_sum),
     fxmem.ModelError, ["[B, 5]", "module fc", _line(M, "self.head(torch.relu"),
                        "the model fails at this op, as eager PyTorch would"]),
    ("api_branch_on_a_value", _analyze(mm.Branchy(), X, loss=_sum), fxmem.DataDependentError,
     ["module (root)", _line(M, "if h.sum() > 0")]),
    ("api_branch_on_a_count", _analyze(mm.MaskBranch(), X, loss=_sum), fxmem.DataDependentError,
     ["True values of a mask of 4*B elements", _line(M, "if picked.shape[0] > 3")]),
    ("api_output_sized_by_data", _analyze(mm.MaskOut(), X), fxmem.InputError,
     ["(n,)", "n: the number of True values"]),
    ("api_output_not_a_loss", _analyze(mm.Net(), X), fxmem.InputError, ["(B, 3)"]),
    ("api_loss_without_targets", _analyze(mm.Net(), X, loss=F.cross_entropy), fxmem.TraceError,
     ["the loss cross_entropy", "no targets"]),
    ("api_batch_size_a_constant", _analyze(mm.FixedBatch(), X, loss=_sum),
     fxmem.SpecializationError, ["specialized to 8"]),
    ("api_forward_raises", _analyze(mm.Raises(), X, loss=_sum), fxmem.TraceError,
     ["my own bug", _line(M, 'raise ValueError("my own bug")')]),
    ("api_size_read_from_a_value", _analyze(mm.SizedByAValue(), X), fxmem.DataDependentError,
     ["a value read from a tensor", "no bound", _line(M, "torch.ones(n.item()")]),
    ("api_size_counted_without_bound", _analyze(mm.SizedByACount(), X),
     fxmem.DataDependentError, ["repeat_interleave", _line(M, "h.repeat_interleave")]),
    ("api_named_dim_in_a_message", _analyze(mm.Tokens(), torch.zeros(8, 6, dtype=torch.long),
                                            dims={"L": [(0, 1)]}), fxmem.ModelError,
     ["[L*B, 4]", "module fc"]),
    ("api_model_a_class", _analyze(mm.Net, X, loss=_sum), fxmem.InputError,
     ["pass an instance, Net()"]),
    ("api_loss_a_class", _analyze(mm.Net(), X, Y, loss=torch.nn.CrossEntropyLoss),
     fxmem.InputError, ["pass an instance, CrossEntropyLoss()"]),
    ("api_optimizer_an_instance", _analyze(mm.Net(), X, Y, loss=F.cross_entropy,
                                           optimizer=torch.optim.SGD(mm.Net().parameters(),
                                                                     lr=0.1)),
     fxmem.InputError, ["pass its class"]),
    ("api_loss_returns_a_float", _analyze(mm.Net(), X, Y, loss=lambda o, y: 3.0),
     fxmem.InputError, ["returned a float"]),
    ("api_loss_not_reduced", _analyze(mm.Net(), X, Y, loss=lambda o, y: o), fxmem.InputError,
     ["returned shape (B, 3)", ".mean()"]),
    ("api_output_a_tuple", _analyze(torch.nn.LSTM(4, 4), torch.randn(8, 3, 4)),
     fxmem.InputError, ["got tuple"]),
    ("api_peak_bytes_zero", lambda: _report().peak_bytes(0), fxmem.InputError,
     ["B must be a positive int"]),
    ("api_peak_bytes_float", lambda: _report().peak_bytes(2.5), fxmem.InputError,
     ["B must be a positive int"]),
    ("api_budget_a_float", lambda: _report().max_batch_size(1.5e9), fxmem.InputError,
     ["budget_bytes must be an int"]),
    ("api_budget_a_string", lambda: _report().max_batch_size("8GiB"), fxmem.InputError,
     ["budget_bytes must be an int"]),
    ("api_budget_too_small", lambda: _report().max_batch_size(10), fxmem.InfeasibleBudgetError,
     ["below the smallest peak"]),
    ("api_dim_not_in_report", lambda: _report().at(L=3), fxmem.InputError, ["in B alone"]),
    ("api_apply_checkpoints_no_such_module", lambda: fxmem.apply_checkpoints(mm.Net(), ["fcc"]),
     fxmem.InputError, ["no submodule 'fcc'"]),
    ("api_measure_device_unknown", lambda: fxmem.measure(mm.Net(), X, loss=_sum, device="tpu",
                                                         B=4), fxmem.InputError,
     ["device must be"]),
    ("api_step_amp_name_unknown", lambda: fxmem.Step(amp="fp32"), fxmem.InputError,
     ["amp is torch.bfloat16 or torch.float16"]),
    ("api_validate_unknown_case", lambda: __import__("fxmem.validate.harness").validate.harness
     .validate("cpu", only=["nosuch"]), fxmem.InputError, ["no validation case 'nosuch'"]),
]


@pytest.mark.parametrize("call, kind, words", [pytest.param(*r[1:], id=r[0]) for r in API])
def test_a_mistake_through_the_api(call, kind, words):
    before = _state()
    with pytest.raises(fxmem.FxmemError) as e:
        call()
    assert _unchanged(before, _state()), "global state changed"
    assert type(e.value) is kind, (type(e.value), str(e.value))
    msg = str(e.value)
    assert msg and "\n" not in msg and not has_internal_symbol(msg), msg
    for w in words:
        assert w in msg, (w, msg)


# --- what else the rows rely on ---------------------------------------------------------------

def test_torch_logs_and_warnings_are_silenced_only_while_tracing():
    """A model that warns and logs through torch's logger (and a meta kernel that fails,
    which torch logs with its traceback): nothing reaches a handler nor the warnings, and
    the levels and filters are as before, after success and after failure."""
    before = _state()
    with _log_records() as records, warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        inner = _state()
        fxmem.analyze(mm.Noisy(), X, Y, loss=F.cross_entropy, device="cpu")
        assert _unchanged(inner, _state())
        with pytest.raises(fxmem.TraceError):
            fxmem.analyze(mm.Noisy(), torch.randn(8, 5), Y, loss=F.cross_entropy, device="cpu")
        assert _unchanged(inner, _state())
        assert records == [] and warned == [], (records, [str(w.message) for w in warned])
        logging.getLogger("torch._subclasses.fake_tensor").error("shown after the trace")
        warnings.warn("warned after the trace")
        assert records == ["shown after the trace"]
        assert [str(w.message) for w in warned] == ["warned after the trace"]
    assert _unchanged(before, _state())


def test_a_noisy_model_on_the_command_line_prints_the_report_alone(capfd):
    code, out, err = run_in_process(["analyze", f"{M}:Noisy", "--input", "B,4", "--target",
                                     "B:int64:3", *CPU, "--format", "json"], capfd)
    assert code == 0 and err == "", err
    assert out.lstrip().startswith("{") and "a torch log line" not in out


@pytest.mark.parametrize("flag", ["--ddp", "--fsdp"])
def test_whatif_with_a_parallel_step(flag, capfd):
    """Once refused: ``--whatif`` with ``--ddp``/``--fsdp`` gives the one-GPU rows and a
    sharding row (the API's, ``fxmem.whatif(..., parallel=)``), the report alone on stdout,
    global state unchanged."""
    import json

    code, out, err = run_in_process([*NET, flag, "2", "--whatif", "--budget", "1MiB",
                                     "--batch", "16", "--format", "json"], capfd)
    assert code == 0 and err == "", err
    doc = json.loads(out)
    parallel = fxmem.DDP(2) if flag == "--ddp" else fxmem.FSDP(2)
    sharded = fxmem.analyze(mm.Net(), X, Y, loss=F.cross_entropy, device="cpu",
                            parallel=parallel)
    rows = {w["method"]: w for w in doc["whatifs"]}
    assert rows["sharding"]["peak_bytes"] == sharded.peak_bytes(16) == doc["peak_bytes"]
    assert rows["sharding"]["max_batch_size"] == sharded.max_batch_size(2**20)
    assert rows["baseline"]["peak_bytes"] == _report().peak_bytes(16)


@pytest.mark.parametrize("spelling", ["fp16", "float16", "half", "torch.float16", "FP16"])
def test_dtype_names_are_one_table(spelling, capfd):
    """torch's names and the short ones, in --input, --amp and Step(amp=...)."""
    from fxmem.cli.targets import parse_tensor

    assert parse_tensor(f"B,4:{spelling}", 2).dtype is torch.float16
    assert fxmem.Step(amp=spelling).amp is torch.float16
    code, out, err = run_in_process([*NET, "--amp", spelling, "--format", "json"], capfd)
    assert code == 0 and err == "", err


def test_an_interrupt_is_one_line(tmp_path, capfd):
    out = tmp_path / "r.json"
    code, stdout, err = run_in_process(["analyze", f"{M}:Interrupted", "--input", "B,4",
                                        "--target", "B:int64:3", *CPU, "--out", str(out)],
                                       capfd)
    assert code == 130 and err == "fxmem: error: interrupted\n" and not out.exists()


def test_out_is_replaced_whole_or_left_alone(tmp_path, capfd):
    out = tmp_path / "r.json"
    out.write_text("the previous report")
    code, _, _ = run_in_process(["analyze", f"{M}:Branchy", "--input", "B,4", "--target",
                                 "B,4", "--loss", "mse", *CPU, "--out", str(out)], capfd)
    assert code == 3 and out.read_text() == "the previous report"
    code, _, err = run_in_process([*NET, "--format", "json", "--out", str(out)], capfd)
    assert code == 0 and err == f"wrote {out}\n"
    assert out.read_text().lstrip().startswith("{")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # no temporary left
