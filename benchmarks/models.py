"""Models shared by the benchmark scripts (random weights from config classes, no downloads)."""

import torch


class LM(torch.nn.Module):
    """A causal LM called with labels: the loss is Hugging Face's own (``.loss``)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, labels):
        return self.model(input_ids=ids, labels=labels)


def gpt2_small(**config):
    """transformers' default GPT2Config (124M parameters) unless ``config`` overrides it."""
    import transformers

    return LM(transformers.GPT2LMHeadModel(transformers.GPT2Config(**config)))
