"""Layers (stacked ensemble, SimNorm, EMA) and the observation encoder."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from robo_rl.nets import mlp as mlp_module
from robo_rl.nets.encoders import EncoderConfig, ObsEncoder, random_shift
from robo_rl.nets.mlp import EnsembleMLP, SimNorm, ema_update_

LIFT_SHAPES = {"object": (10,), "robot0_eef_pos": (3,), "robot0_eef_quat": (4,), "robot0_gripper_qpos": (2,)}
SMALL = EncoderConfig(latent_dim=16, hidden_dims=(32,), cnn_channels=8, image_feature_dim=8, task_embed_dim=4)


def per_head_forward(net: EnsembleMLP, x: torch.Tensor, head: int) -> torch.Tensor:
    """Member `head` of the ensemble as an ordinary MLP, one F.linear per layer."""
    *hidden, last = net.linears
    for i, layer in enumerate(hidden):
        x = F.linear(x, layer.weight[head].T, layer.bias[head, 0])
        norm = net.norms[i]
        x = F.gelu(F.layer_norm(x, x.shape[-1:], norm.weight[head, 0], norm.bias[head, 0]))
    return F.linear(x, last.weight[head].T, last.bias[head, 0])


@pytest.mark.parametrize("one_member_at_a_time", [False, True])
def test_ensemble_forward_equals_per_head_loop(one_member_at_a_time, monkeypatch):
    if one_member_at_a_time:  # large batches without autograd: a zero limit sends these ones there
        monkeypatch.setattr(mlp_module, "_STACKED_CACHE_LIMIT", 0)

        def stacked_layer_called(*args, **kwargs):
            raise AssertionError("the stacked EnsembleLinear ran; expected EnsembleMLP._forward_members")

        monkeypatch.setattr(mlp_module.EnsembleLinear, "forward", stacked_layer_called)
    torch.manual_seed(0)
    net = EnsembleMLP(4, 5, (16, 16), 3)
    for p in net.parameters():  # non-trivial LayerNorm affines too
        p.data.normal_(0, 0.5)
    shared = torch.randn(7, 5)
    per_member = torch.randn(4, 7, 5)
    expected_shared = torch.stack([per_head_forward(net, shared, e) for e in range(4)])
    expected_member = torch.stack([per_head_forward(net, per_member[e], e) for e in range(4)])
    heads = torch.tensor([3, 1])
    with torch.set_grad_enabled(not one_member_at_a_time):
        torch.testing.assert_close(net(shared), expected_shared)
        torch.testing.assert_close(net(per_member), expected_member)
        torch.testing.assert_close(net(shared, heads), expected_shared[heads])
        torch.testing.assert_close(net(per_member[heads], heads), expected_member[heads])


def test_ensemble_detach_params_passes_gradient_to_inputs_only():
    net = EnsembleMLP(3, 4, (8,), 1)
    x = torch.randn(5, 4, requires_grad=True)
    net(x, detach_params=True).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert all(p.grad is None for p in net.parameters())


def test_simnorm_groups_are_simplices():
    z = SimNorm(4)(torch.randn(3, 12) * 5)
    groups = z.view(3, 3, 4)
    torch.testing.assert_close(groups.sum(-1), torch.ones(3, 3))
    assert (z > 0).all()


def test_ema_update_moves_target_by_tau():
    online, target = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    before = target.weight.detach().clone()
    ema_update_(target, online, 0.25)
    torch.testing.assert_close(target.weight, 0.75 * before + 0.25 * online.weight.detach())


def lift_obs(*lead: int) -> dict[str, torch.Tensor]:
    return {k: torch.randn(*lead, *s) for k, s in LIFT_SHAPES.items()}


def test_state_encoder_shapes_leading_dims_and_normalization():
    torch.manual_seed(0)
    encoder = ObsEncoder(LIFT_SHAPES, config=SMALL)
    obs = lift_obs(6)
    z = encoder(obs)
    assert z.shape == (6, 16)
    # SimNorm latent: every group of 8 is a distribution.
    torch.testing.assert_close(z.view(6, 2, 8).sum(-1), torch.ones(6, 2))
    # A leading time dim is kept and each step encodes like a batch of its own.
    seq = lift_obs(3, 6)
    torch.testing.assert_close(encoder(seq)[1], encoder({k: v[1] for k, v in seq.items()}))

    stats = {"object": (torch.full((10,), 2.0), torch.full((10,), 4.0)), "robot0_eef_pos": ([1.0] * 3, [1e-6] * 3)}
    encoder.set_normalization(stats)
    assert encoder.low_dim_mean[:10].eq(2.0).all() and encoder.low_dim_std[:10].eq(4.0).all()
    assert encoder.low_dim_std[10:13].min() > 1e-3  # std floor for near-constant features
    assert "low_dim_mean" in encoder.state_dict()
    assert not torch.allclose(encoder(obs), z)
    with pytest.raises(ValueError, match="unknown low-dim keys"):
        encoder.set_normalization({"joint_pos": ([0.0], [1.0])})
    with pytest.raises(KeyError, match="object"):
        encoder({k: v for k, v in obs.items() if k != "object"})


def test_random_shift_crops_the_padded_image():
    torch.manual_seed(0)
    images = torch.rand(16, 3, 10, 12)
    shifted = random_shift(images, pad=2)
    padded = F.pad(images, (2, 2, 2, 2), mode="replicate")
    for i in range(16):
        crops = [padded[i, :, dy : dy + 10, dx : dx + 12] for dy in range(5) for dx in range(5)]
        assert any(torch.equal(shifted[i], crop) for crop in crops)
    assert not torch.equal(shifted, images)


def test_image_encoder_shifts_only_in_train_mode_and_uses_task_id():
    torch.manual_seed(0)
    shapes = {"agentview_image": (3, 48, 48), "robot0_eef_pos": (3,), "task_id": ()}
    encoder = ObsEncoder(shapes, num_tasks=3, config=SMALL)
    obs = {
        "agentview_image": torch.randint(0, 256, (4, 3, 48, 48), dtype=torch.uint8),
        "robot0_eef_pos": torch.randn(4, 3),
        "task_id": torch.tensor([0, 1, 2, 0]),
    }
    encoder.eval()
    z = encoder(obs)
    assert z.shape == (4, 16)
    torch.testing.assert_close(encoder(obs), z)  # deterministic: no augmentation
    other_task = dict(obs, task_id=torch.tensor([1, 2, 0, 1]))
    assert not torch.allclose(encoder(other_task), z)
    encoder.train()
    assert not torch.allclose(encoder(obs), encoder(obs))  # random shifts differ per call

    with pytest.raises(ValueError, match="too small"):
        ObsEncoder({"agentview_image": (3, 32, 32)}, config=SMALL)


def test_encoder_gradients_reach_cnn_and_embedding():
    shapes = {"agentview_image": (3, 48, 48), "eye_in_hand_rgb": (3, 48, 48), "task_id": ()}
    encoder = ObsEncoder(shapes, num_tasks=2, config=dataclasses.replace(SMALL, share_cnn=True))
    assert list(encoder.cnns) == ["agentview_image"]  # one CNN for both cameras
    obs = {k: torch.randint(0, 256, (2, 3, 48, 48), dtype=torch.uint8) for k in shapes if k != "task_id"}
    encoder(dict(obs, task_id=torch.tensor([0, 1]))).square().sum().backward()
    assert encoder.cnns["agentview_image"].convs[0].weight.grad.abs().sum() > 0
    assert encoder.task_embedding.weight.grad.abs().sum() > 0
