"""One place decides each setting (docs/architecture.md, "Where each setting is decided")."""
from pathlib import Path

import pytest
import torch
import yaml

from robo_rl.checkpoint import build_actor, build_agent
from robo_rl.config import ConfigError, validate
from robo_rl.core import ACTION_DIM, TASK_KEY
from robo_rl.envs.spec import EnvSpec
from test_bad_inputs import compose_config

CONF = Path(__file__).resolve().parents[1] / "conf"


def _keys(node: dict, prefix: str = "") -> set[str]:
    """Dotted leaf keys of a YAML mapping."""
    out = set()
    for k, v in node.items():
        out |= _keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k}
    return out


def test_network_sizes_live_in_one_file_per_budget_and_budgets_set_no_agent_key():
    algorithm = _keys(yaml.safe_load((CONF / "agent" / "sorl.yaml").read_text()))
    sizes = {p.stem: _keys(yaml.safe_load(p.read_text())) for p in (CONF / "agent" / "size").glob("*.yaml")}
    budgets = {p.stem: yaml.safe_load(p.read_text()) for p in (CONF / "budget").glob("*.yaml")}
    assert set(sizes) == set(budgets)  # every budget has its sizes
    for name, keys in sizes.items():
        assert not keys & algorithm, f"agent/size/{name}.yaml and agent/sorl.yaml both set {keys & algorithm}"
        assert keys == sizes["cpu"]  # each size file sets the same keys, so none falls back on another file
        assert "agent" not in budgets[name]


@pytest.mark.parametrize("overrides, critics, latent", [
    (["budget=gpu"], 10, 256), (["budget=smoke"], 2, 32), ([], 4, 128),
    (["budget=gpu", "agent/size=cpu"], 4, 128),  # a budget's steps with other networks
    (["agent.num_critics=6"], 6, 128),  # the command line still has the last word
])
def test_the_budget_picks_the_network_sizes(overrides, critics, latent):
    cfg = compose_config("config", overrides)
    assert cfg.agent.num_critics == critics and cfg.agent.encoder.latent_dim == latent
    validate(cfg, "config")


@pytest.mark.parametrize("override, fragments", [
    ("+planner.gamma=0.9", ["planner.gamma", "train.gamma"]),
    ("+planner.policy_steps=2", ["planner.policy_steps", "agent.sample_steps"]),
])
def test_search_settings_that_another_setting_decides_are_refused(override, fragments):
    with pytest.raises(ConfigError) as e:
        validate(compose_config("config", [override]), "config")
    assert all(f in str(e.value) for f in fragments)


def test_chunks_refuse_an_nstep_they_would_ignore():
    with pytest.raises(ConfigError, match=r"train.nstep=3 with agent.action_horizon=2.*train.nstep=1"):
        validate(compose_config("config", ["agent.action_horizon=2"]), "config")
    validate(compose_config("config", ["agent.action_horizon=2", "train.nstep=1"]), "config")


def test_chunks_refuse_to_execute_more_actions_than_they_hold():
    with pytest.raises(ConfigError, match=r"agent.execute_steps=3: a chunk holds agent.action_horizon=2"):
        validate(compose_config("config", ["agent.action_horizon=2", "train.nstep=1", "agent.execute_steps=3"]), "config")
    validate(compose_config("config", ["agent.action_horizon=2", "train.nstep=1", "agent.execute_steps=1"]), "config")


def test_the_search_discounts_with_train_gamma_and_samples_with_agent_sample_steps():
    cfg = compose_config("config", ["budget=smoke", "train.gamma=0.9", "agent.sample_steps=2"])
    agent = build_agent(cfg.agent, {"object": (10,), TASK_KEY: ()}, 1)
    actor = build_actor(agent, cfg.planner, cfg.train.gamma, cfg.seed)
    assert actor.planner.gamma == 0.9 and agent.policy.sample_steps == 2 and agent.action_dim == ACTION_DIM


def test_task_ids_index_the_suite_so_num_tasks_covers_the_largest():
    spec = EnvSpec(suite="libero", env_name="libero_10", low_dim_keys=("joint_states",), task_ids=(3, 5))
    assert spec.num_tasks == 6
    cfg = compose_config("config", ["budget=smoke"])
    agent = build_agent(cfg.agent, {"joint_states": (7,), TASK_KEY: ()}, spec.num_tasks)
    z = agent.encode({"joint_states": torch.zeros(2, 7), TASK_KEY: torch.tensor([3, 5])})  # embeds both ids
    assert z.shape[0] == 2


def _default(field):
    import dataclasses

    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory()


def _differences(schema, node: dict, prefix: str = "") -> list[str]:
    """Keys of a YAML group whose value is not the dataclass default (`schema`'s field of the same name)."""
    import dataclasses

    fields = {f.name: f for f in dataclasses.fields(schema)}
    out = []
    for key, value in node.items():
        if key == "name":
            continue
        default = _default(fields[key])
        if isinstance(value, dict):
            out += _differences(type(default), value, f"{prefix}{key}.")
        elif (list(default) if isinstance(default, tuple) else default) != value:
            out.append(f"{prefix}{key}: yaml {value!r}, dataclass {default!r}")
    return out


def test_each_default_is_stated_once_the_yaml_agrees_with_the_dataclass():
    """conf/agent/sorl.yaml and conf/planner/qwm.yaml list the settings for a reader; the dataclasses the code builds
    from (SORLConfig, QWMConfig) hold the same defaults, so code built without Hydra (benchmarks, tests) acts as a
    run does. The network sizes are the paper's (conf/agent/size/gpu.yaml); other budgets' size files differ."""
    from robo_rl.agents.sorl import SORLConfig
    from robo_rl.planning.qwm import QWMConfig

    from omegaconf import OmegaConf

    for schema, path in ((SORLConfig, CONF / "agent" / "sorl.yaml"), (QWMConfig, CONF / "planner" / "qwm.yaml"),
                         (SORLConfig, CONF / "agent" / "size" / "gpu.yaml")):
        yaml_node = OmegaConf.to_container(OmegaConf.load(path))  # as Hydra reads it (3e-4 is a number)
        assert not _differences(schema, yaml_node), (path, _differences(schema, yaml_node))


def test_planner_qwm_paper_is_the_papers_search_on_top_of_the_defaults():
    """planner=qwm_paper: one imagined path per root action and no drift guard; everything else as planner=qwm."""
    from robo_rl.schemas import PlannerConfig

    cfg = validate(compose_config("config", ["planner=qwm_paper"]), "config")
    assert cfg.planner == PlannerConfig(name="qwm", num_samples=1, drift_decay=None)


def test_scripts_hand_on_the_typed_config_and_it_survives_a_checkpoint():
    """validate() returns the typed config the library takes; recorded as plain values (checkpoints, metrics) it
    rebuilds into the same typed config."""
    from robo_rl.envs import env_spec
    from robo_rl.schemas import EvaluateConfig, TrainConfig
    from robo_rl.utils.schema import from_dict, to_plain

    cfg = validate(compose_config("config", ["task=libero_10", "env=state"]), "config")
    assert isinstance(cfg, TrainConfig) and isinstance(cfg.task.task_ids, tuple | type(None))
    spec = env_spec(cfg)
    assert spec.suite == "libero" and spec.low_dim_keys == cfg.task.obs_keys["state"].low_dim
    assert from_dict(TrainConfig, to_plain(cfg)) == cfg
    assert isinstance(validate(compose_config("evaluate", ["policy=random"]), "evaluate"), EvaluateConfig)
