"""The Megatron engine's logged loss is the mean per-token loss of the micro-batch, also after megatron-core's
schedule divided the returned loss by the number of micro-batches in place."""

import torch

from phoenix_hpc.engines.megatron_engine import lm_loss


def test_the_logged_loss_is_not_divided_with_the_returned_one():
    per_token = torch.full((2, 8), 5.5, dtype=torch.bfloat16)
    loss, logged = lm_loss(per_token)
    loss /= 4  # what megatron-core's forward_step does with the loss it is given (num_microbatches = 4)
    assert float(logged["lm loss"]) == 5.5 and float(loss) == 5.5 / 4
    assert logged["lm loss"].dtype == torch.float32 and logged["lm loss"].dim() == 0
