import os
import sys
import warnings

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
warnings.filterwarnings("ignore", category=UserWarning)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _global_state_unchanged():
    """Every test, passing or failing, must leave PyTorch's global state as it found it."""
    from torch.nn.modules import module as m
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    before = (torch.get_default_dtype(), torch.is_grad_enabled(), torch.clear_autocast_cache,
              torch._C._dispatch_dump("aten::softmax.int"), torch.is_autocast_enabled("cpu"),
              len(_get_current_dispatch_mode_stack()), len(_get_current_function_mode_stack()),
              len(m._global_forward_hooks), len(m._global_forward_pre_hooks))
    yield
    after = (torch.get_default_dtype(), torch.is_grad_enabled(), torch.clear_autocast_cache,
              torch._C._dispatch_dump("aten::softmax.int"), torch.is_autocast_enabled("cpu"),
             len(_get_current_dispatch_mode_stack()), len(_get_current_function_mode_stack()),
             len(m._global_forward_hooks), len(m._global_forward_pre_hooks))
    assert after == before, "global state changed"
