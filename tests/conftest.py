import os

from robo_rl.utils.threads import prepare_openmp

prepare_openmp()  # before torch loads, as the scripts do; the scripts the tests start inherit it

import pytest  # noqa: E402
import torch  # noqa: E402

os.environ.setdefault("WANDB_MODE", "disabled")
torch.set_num_threads(1)  # tests run on 2 cores next to env worker processes

LIFT_STATE_KEYS = ("object", "robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos")


@pytest.fixture
def lift_spec():
    from robo_rl.envs.spec import EnvSpec

    return EnvSpec(suite="robosuite", env_name="Lift", low_dim_keys=LIFT_STATE_KEYS, horizon=50)
