"""A single LIBERO env with LIBERO's dataset observation keys, images upright.

Env i of a vector runs task `task_ids[i % n]`; `reset(options={"task_id": t})` switches task
(rebuilding the scene, ~10-20 s on 2 cores) and `options={"init_state_id": j}` starts from the
j-th of the task's fixed initial states (LIBERO's evaluation protocol). Every reset then lets the scene
settle for SETTLE_STEPS no-op steps before the episode's first observation; they are not episode steps.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from robo_rl.core import TASK_KEY
from robo_rl.envs.base import SimEnv
from robo_rl.envs.spec import EnvSpec, camera_of, to_channels_first
from robo_rl.utils.rendering import configure_mujoco

# The published protocol (openpi examples/libero/main.py `num_steps_wait`, OpenVLA run_libero_eval.py): LIBERO
# places objects slightly above their supports, so the first steps after a reset are spent waiting for them to
# fall, with the arm still and the gripper open; the step limit (task.horizon) counts only the steps after.
SETTLE_STEPS = 10
NOOP_ACTION = np.array([0.0] * 6 + [-1.0])  # OSC_POSE: no translation or rotation, gripper open (-1)
# `object`, the state observation (env=state): one fixed layout for every LIBERO task, zero where a task has
# fewer entries. Parts, in order:
#   objects: the task's objects of interest (its BDDL `:obj_of_interest`, in that order; LIBERO-Object: the item,
#     then the basket), OBJECT_FEATURES each, as robomimic's `object` key holds one: position [3], quaternion
#     xyzw [4], position relative to the hand [3]; OBJECT_SLOTS of them, the most any LIBERO task names (4,
#     LIBERO-10);
#   regions: the regions the goal names (BDDL `:goal` arguments that are regions, e.g. `basket_1_contain_region`,
#     `flat_stove_1_cook_region`, `white_cabinet_1_bottom_region`, `living_room_table_plate_right_region`, in the
#     goal's order), REGION_FEATURES each: the site's position [3], its position relative to the hand [3]; a
#     region on a moving part (a drawer) moves with it. REGION_SLOTS of them (LIBERO-90 names up to 2);
#   joints: the position (rad or m) of the articulated part each unary goal predicate (`Turnon`, `Close`, `Open`,
#     `Turnoff`) names, in the goal's order: the stove's knob, a drawer's slide, the microwave door's hinge.
#     JOINT_SLOTS of them (LIBERO-90 names up to 2).
OBJECT_SLOTS = 4
OBJECT_FEATURES = 10
REGION_SLOTS = 2
REGION_FEATURES = 6
JOINT_SLOTS = 2
REGIONS_START = OBJECT_SLOTS * OBJECT_FEATURES          # where the regions begin in `object`
JOINTS_START = REGIONS_START + REGION_SLOTS * REGION_FEATURES
OBJECT_OBS_DIM = JOINTS_START + JOINT_SLOTS              # 54
UNARY_PREDICATES = ("turnon", "turnoff", "open", "close")  # the goal predicates of one articulated part
# MuJoCo's arena (contacts, constraints, solver stack) per env. robosuite's base.xml asks for njmax = nconmax =
# 5000, which MuJoCo 3 turns into a 1.26 GB arena in every env; LIBERO-10's most cluttered scene uses 6.5 MB of it
# at most (maxuse_arena over an expert episode of task 4), and the same episodes run step for step alike with 64 MB.
# ~0.5 GB less per env worker: 8 training envs beside an evaluation's own no longer exhaust 24 GB.
MUJOCO_ARENA = "64M"


@dataclass(frozen=True)
class GoalLayout:
    """The names behind each part of the `object` observation, from a task's parsed BDDL problem."""

    objects: tuple[str, ...]      # objects of interest, one per object slot
    regions: tuple[str, ...]      # goal regions, one per region slot
    articulated: tuple[str, ...]  # the object or region of each unary goal predicate, one per joint slot

    @classmethod
    def of(cls, problem: dict) -> GoalLayout:
        """From LIBERO's parsed problem (`robosuite_parse_problem`: `obj_of_interest`, `regions`, `goal_state`,
        a list of [predicate, *arguments])."""
        regions = []
        for _, *arguments in problem["goal_state"]:
            regions += [a for a in arguments if a in problem["regions"] and a not in regions]
        articulated = tuple(arguments[0] for predicate, *arguments in problem["goal_state"]
                            if predicate in UNARY_PREDICATES)
        layout = cls(tuple(problem["obj_of_interest"]), tuple(regions), articulated)
        for part, names, slots in (("objects", layout.objects, OBJECT_SLOTS), ("regions", layout.regions, REGION_SLOTS),
                                   ("joints", layout.articulated, JOINT_SLOTS)):
            if len(names) > slots:
                raise ValueError(f"LIBERO problem {problem['problem_name']} names {len(names)} {part} ({names}); the "
                                 f"`object` observation holds {slots}: raise its {part} slots")
        return layout


def split_object_obs(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The parts of `object` observations [B, OBJECT_OBS_DIM]: objects [B, OBJECT_SLOTS, OBJECT_FEATURES],
    regions [B, REGION_SLOTS, REGION_FEATURES], joints [B, JOINT_SLOTS]."""
    batch = obs.shape[0]
    return (obs[:, :REGIONS_START].reshape(batch, OBJECT_SLOTS, OBJECT_FEATURES),
            obs[:, REGIONS_START:JOINTS_START].reshape(batch, REGION_SLOTS, REGION_FEATURES),
            obs[:, JOINTS_START:OBJECT_OBS_DIM])


def load_suite(name: str):
    """LIBERO benchmark object for a suite name (`libero_10`, `libero_spatial`, ...)."""
    configure_mujoco()
    from robo_rl.envs.setup_sim import ensure_libero_ready

    ensure_libero_ready()
    from libero.libero import benchmark

    suites = benchmark.get_benchmark_dict()
    if name not in suites:
        raise ValueError(f"unknown LIBERO suite {name!r}; choose one of {sorted(suites)}")
    return suites[name]()


def task_instructions(suite_name: str) -> list[str]:
    """The language instruction of each task of a suite, by task id."""
    suite = load_suite(suite_name)
    return [suite.get_task(i).language for i in range(suite.n_tasks)]


def task_of_instruction(instructions: list[str], instruction: str | None) -> int | None:
    """The task id whose instruction (of `task_instructions`) is `instruction`, ignoring case and
    surrounding spaces; None when no task has it. LIBERO dataset files hold one task each, named so."""
    normalized = [s.strip().lower() for s in instructions]
    if instruction is None or instruction.strip().lower() not in normalized:
        return None
    return normalized.index(instruction.strip().lower())


def task_problem(suite_name: str, task_id: int) -> dict:
    """LIBERO's parsed BDDL problem of a task (objects, regions, `obj_of_interest`, `goal_state`), read from its
    file without building the scene."""
    suite = load_suite(suite_name)
    from libero.libero import get_libero_path
    from libero.libero.envs.bddl_utils import robosuite_parse_problem

    task = suite.get_task(task_id)
    return robosuite_parse_problem(os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file))


def _pose_xyzw(env, name: str) -> tuple[np.ndarray, np.ndarray]:
    """World position [3] and quaternion xyzw [4] of a LIBERO object or fixture (a body) or region (a site)."""
    data = env.sim.data
    if name in env.obj_body_id:
        body = env.obj_body_id[name]
        return data.body_xpos[body], data.body_xquat[body][[1, 2, 3, 0]]  # MuJoCo keeps wxyz
    from robosuite.utils.transform_utils import mat2quat

    return data.get_site_xpos(name), mat2quat(data.get_site_xmat(name))


def _articulation_joint(env, name: str) -> str:
    """The joint a unary goal predicate on `name` reads: a region's own joint (a drawer's slide), else the object's
    first joint that is not a free joint (the stove's knob, the microwave door's hinge)."""
    site = env.object_sites_dict.get(name)
    joints = site.joints if site is not None else env.get_object(name).joints
    model = env.sim.model
    hinged = [j for j in joints if model.jnt_type[model.joint_name2id(j)] != 0]  # 0: mjJNT_FREE
    if not hinged:
        raise ValueError(f"LIBERO {name!r} has no articulated joint (joints: {joints})")
    return hinged[0]


def _quat_to_axis_angle(quat_xyzw: np.ndarray) -> np.ndarray:
    """robosuite quaternion (x, y, z, w) -> axis-angle [3], as LIBERO's datasets store `ee_ori`."""
    w = np.clip(quat_xyzw[3], -1.0, 1.0)
    den = np.sqrt(1.0 - w * w)
    if den < 1e-8:
        return np.zeros(3, dtype=np.float32)
    return (quat_xyzw[:3] * 2.0 * np.arccos(w) / den).astype(np.float32)


def _bound_mujoco_arena() -> None:
    """Every robosuite world this process builds from now on asks for MUJOCO_ARENA (robosuite has no option for it:
    its worlds start from base.xml; LIBERO's scenes are such worlds)."""
    from robosuite.models.world import MujocoWorldBase

    if getattr(MujocoWorldBase, "_robo_rl_arena", None) == MUJOCO_ARENA:
        return
    build = MujocoWorldBase.__init__

    def __init__(self, *args, **kwargs):
        build(self, *args, **kwargs)
        self.root.find("size").attrib = {"memory": MUJOCO_ARENA}

    MujocoWorldBase.__init__ = __init__
    MujocoWorldBase._robo_rl_arena = MUJOCO_ARENA


class LiberoEnv(SimEnv):
    """Gym-like single env. `step` returns (obs, reward, terminated, truncated, success)."""

    def __init__(self, spec: EnvSpec, env_index: int = 0):
        _bound_mujoco_arena()
        self.spec = spec
        self.suite = load_suite(spec.env_name)
        self.env = None
        self.task_id = -1
        self._build(spec.task_ids[env_index % len(spec.task_ids)])
        self._t = 0

    def _build(self, task_id: int) -> None:
        from libero.libero import get_libero_path
        from libero.libero.envs.env_wrapper import ControlEnv

        if self.env is not None:
            self.env.close()
        task = self.suite.get_task(task_id)
        bddl = os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file)
        cameras = list(self.spec.cameras) or ["agentview"]
        # LIBERO's OffScreenRenderEnv is this env with a renderer always on: ~0.5 GB more per env where nothing is
        # rendered (state obs, no video)
        self.env = ControlEnv(
            bddl_file_name=bddl,
            camera_names=cameras,
            camera_heights=self.spec.image_size,
            camera_widths=self.spec.image_size,
            use_camera_obs=bool(self.spec.rgb_keys),
            has_renderer=False,
            has_offscreen_renderer=bool(self.spec.rgb_keys) or self.spec.render_size > 0,
            **self.spec.env_kwargs,
        )
        self.task_id = task_id
        self.instruction = task.language
        self.init_states = self.suite.get_task_init_states(task_id)  # [50, state_dim]
        env = self._robosuite_env
        self.layout = GoalLayout.of(env.parsed_problem)
        self._joint_addresses = [env.sim.model.get_joint_qpos_addr(_articulation_joint(env, name))
                                 for name in self.layout.articulated]

    def _obs(self, raw: dict) -> dict[str, np.ndarray]:
        eef_pos = raw["robot0_eef_pos"].astype(np.float32)
        ee_ori = _quat_to_axis_angle(raw["robot0_eef_quat"])
        derived = {
            "joint_states": raw["robot0_joint_pos"],
            "gripper_states": raw["robot0_gripper_qpos"],
            "ee_pos": eef_pos,
            "ee_ori": ee_ori,
            "ee_states": np.concatenate([eef_pos, ee_ori]),
        }
        if "object" in self.spec.low_dim_keys:
            derived["object"] = self._objects_of_interest(eef_pos)
        obs = {k: np.asarray(derived[k] if k in derived else raw[k], dtype=np.float32) for k in self.spec.low_dim_keys}
        for key in self.spec.rgb_keys:
            obs[key] = to_channels_first(raw[f"{camera_of(key)}_image"])
        obs[TASK_KEY] = np.int64(self.task_id)
        return obs

    def _objects_of_interest(self, eef_pos: np.ndarray) -> np.ndarray:
        """The `object` observation [OBJECT_OBS_DIM] (see OBJECT_SLOTS)."""
        env = self._robosuite_env
        objects = np.zeros((OBJECT_SLOTS, OBJECT_FEATURES), dtype=np.float32)
        for slot, name in enumerate(self.layout.objects):
            pos, quat = _pose_xyzw(env, name)
            objects[slot] = np.concatenate([pos, quat, pos - eef_pos])
        regions = np.zeros((REGION_SLOTS, REGION_FEATURES), dtype=np.float32)
        for slot, name in enumerate(self.layout.regions):
            pos = env.sim.data.get_site_xpos(name)
            regions[slot] = np.concatenate([pos, pos - eef_pos])
        joints = np.zeros(JOINT_SLOTS, dtype=np.float32)
        joints[:len(self._joint_addresses)] = env.sim.data.qpos[self._joint_addresses]
        return np.concatenate([objects.reshape(-1), regions.reshape(-1), joints])

    def reset(self, seed: int | None = None, options: dict | None = None) -> dict[str, np.ndarray]:
        options = options or {}
        if options.get("task_id") is not None and options["task_id"] != self.task_id:
            self._build(int(options["task_id"]))
        if seed is not None:
            np.random.seed(seed)
            self.env.seed(seed)
        raw = self.env.reset()
        state_id = options.get("init_state_id")
        if state_id is not None:
            raw = self.env.set_init_state(self.init_states[int(state_id) % len(self.init_states)])
        self._t = 0
        if options.get("snapshot") is not None:  # a mid-episode `snapshot()`: continues that episode
            raw = self.restore(options["snapshot"])
        else:
            for _ in range(SETTLE_STEPS):
                raw, *_ = self.env.step(NOOP_ACTION)
        return self._obs(raw)

    def _success(self) -> bool:
        return bool(self.env.check_success())
