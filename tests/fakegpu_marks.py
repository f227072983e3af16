"""Where the fake GPU's tests run (``pytestmark = FAKE_GPU`` in tests/test_fake_gpu*.py): a
CUDA build of torch (CI's 2.14.1 and 2.15 environments) and gcc to build the stub; skipped
on the CPU build. ``FAKE_CUDNN`` adds cuDNN, for the convolution, batch-norm, RNN and cuDNN
attention steps."""

import shutil

import pytest
import torch

FAKE_GPU = [
    pytest.mark.skipif(torch.version.cuda is None,
                       reason=f"torch {torch.__version__} is not a CUDA build"),
    pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc to build the stub"),
]
FAKE_CUDNN = [
    *FAKE_GPU,
    pytest.mark.skipif(torch.version.cuda is None or torch.backends.cudnn.version() is None,
                       reason=f"torch {torch.__version__} has no cuDNN"),
]
