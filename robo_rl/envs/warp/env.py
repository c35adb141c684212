"""`WarpVecEnv`: B robosuite worlds stepped together by MuJoCo Warp, behind the `VecEnv` interface.

One control step = `substeps` (25) physics steps, each split like MuJoCo's `mj_step1`/`mj_step2` so
the OSC controller reads the fresh kinematics, inertia and bias forces and writes `ctrl` in between
(robosuite recomputes the torques every substep too). Observations, reward and success read the data
after the last substep, exactly where robosuite reads them (its body/site poses are those of the last
substep's start, its qpos the integrated one). On CUDA the whole control step is one captured graph.
Outputs are torch tensors on `device`; Warp arrays are shared with torch (`wp.to_torch`), not copied.
"""
from __future__ import annotations

import contextlib
import copy

import mujoco
import mujoco_warp as mjw
import numpy as np
import torch
import warp as wp

from robo_rl.core import ACTION_DIM, TASK_KEY, Obs
from robo_rl.envs.robosuite import make_robosuite_env
from robo_rl.envs.spec import EnvSpec, camera_of
from robo_rl.envs.vector import StepResult, per_env_seeds
from robo_rl.envs.warp import osc
from robo_rl.envs.warp.render import BatchCameraRenderer, FrameRenderer
from robo_rl.envs.warp.scene import NULLSPACE_KP, RobotConstants, configure_warp, robot_constants
from robo_rl.envs.warp.tasks import TASKS

# Contact/constraint buffers per world. Lift with the cube grasped needs ~47 constraint rows (9 dof
# friction-loss rows + 3 per elliptic contact); the defaults (64 rows) leave too little headroom.
CONTACTS_PER_WORLD = 64
CONSTRAINTS_PER_WORLD = 192


class WarpVecEnv:
    """`num_envs` worlds of one robosuite task on MuJoCo Warp (`device` "cpu" or "cuda[:i]")."""

    def __init__(self, spec: EnvSpec, num_envs: int, device: str | torch.device = "cpu", autoreset: bool = True):
        if spec.suite != "robosuite" or spec.env_name not in TASKS:
            raise ValueError(f"env.backend=warp supports robosuite tasks {list(TASKS)}; got "
                             f"suite={spec.suite!r} env_name={spec.env_name!r} (use env.backend=subprocess)")
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        configure_warp()
        self.spec, self.num_envs, self.autoreset = spec, num_envs, autoreset
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.wp_device = wp.device_from_torch(self.device)

        rs_env = make_robosuite_env(spec)
        self.mjm = copy.copy(rs_env.sim.model._model)
        # The controller reads the dense joint-space inertia. MuJoCo's `auto` keeps it dense below 60
        # dofs (so robosuite's CPU sim is dense), MuJoCo Warp's only up to 32 (PickPlaceCan has 33).
        self.mjm.opt.jacobian = mujoco.mjtJacobian.mjJAC_DENSE
        self.robot: RobotConstants = robot_constants(rs_env, self.mjm)
        self.task = TASKS[spec.env_name](rs_env, self.mjm)
        rs_env.close()
        self._obs_fns = self._observation_functions(spec.low_dim_keys)

        with wp.ScopedDevice(self.wp_device):
            self.m = mjw.put_model(self.mjm)
            mjd = mujoco.MjData(self.mjm)
            mujoco.mj_forward(self.mjm, mjd)
            self.d = mjw.put_data(self.mjm, mjd, nworld=num_envs, nconmax=CONTACTS_PER_WORLD,
                                  njmax=CONSTRAINTS_PER_WORLD)
            self.params = self._osc_params()
            self.goal_pos = wp.zeros(num_envs, dtype=wp.vec3)
            self.goal_ori = wp.zeros(num_envs, dtype=wp.mat33)
            self.q_init = wp.zeros(num_envs, dtype=osc.vec7)
            self.gripper_cmd = wp.zeros(num_envs, dtype=float)
            self.actions = wp.zeros((num_envs, ACTION_DIM), dtype=float)
            self._camera_renderer = None
            if spec.rgb_keys:
                self._camera_renderer = BatchCameraRenderer(self.mjm, num_envs, spec.cameras, spec.image_size)
        # Torch views of the Warp arrays (shared memory).
        self._qpos, self._qvel = wp.to_torch(self.d.qpos), wp.to_torch(self.d.qvel)
        self._site_xpos, self._site_xmat = wp.to_torch(self.d.site_xpos), wp.to_torch(self.d.site_xmat)
        self._xpos, self._xquat = wp.to_torch(self.d.xpos), wp.to_torch(self.d.xquat)
        self._actions, self._time = wp.to_torch(self.actions), wp.to_torch(self.d.time)
        self._goal_pos, self._goal_ori = wp.to_torch(self.goal_pos), wp.to_torch(self.goal_ori)
        self._q_init = wp.to_torch(self.q_init)
        # Everything a world's future depends on: physics state + controller state.
        self._state = [self._qpos, self._qvel, wp.to_torch(self.d.act), wp.to_torch(self.d.ctrl),
                       wp.to_torch(self.d.qacc_warmstart), self._time, self._goal_pos, self._goal_ori,
                       self._q_init, wp.to_torch(self.gripper_cmd)]
        self._qpos0 = self.mjm.qpos0.copy()

        self._frame_renderer: FrameRenderer | None = None

        self._t = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self._episode_seeds: list[int | None] = [None] * num_envs
        entropy = np.random.SeedSequence().generate_state(num_envs)
        self._rngs = [np.random.RandomState(int(s)) for s in entropy]
        self._obs: Obs | None = None
        self._pending = None  # step_async's arguments until step_wait
        self._graph = None
        if self.wp_device.is_cuda:
            self._graph = self._capture_control_step()

    # -- metadata ------------------------------------------------------------------------------
    @property
    def action_dim(self) -> int:
        return ACTION_DIM

    @property
    def instructions(self) -> list[str]:
        return [self.spec.env_name] * self.num_envs

    def get(self, name: str) -> list:
        """Per-env attribute, as `VecEnv.get`: `instruction`, `task_id` or `sim_state` ([1 + nq + nv])."""
        if name == "instruction":
            return self.instructions
        if name == "task_id":
            return [0] * self.num_envs
        if name == "sim_state":
            time = self._time.double().cpu().numpy()
            qpos, qvel = self._qpos.double().cpu().numpy(), self._qvel.double().cpu().numpy()
            return [np.concatenate([[time[i]], qpos[i], qvel[i]]) for i in range(self.num_envs)]
        raise AttributeError(f"WarpVecEnv has no per-env attribute {name!r}")

    # -- control -------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, options: list[dict] | None = None) -> Obs:
        """Reset all envs; env i gets seed `seed + i` and `options[i]`."""
        return self.reset_envs(list(range(self.num_envs)), seed, options)

    def reset_envs(self, env_ids: list[int], seed=None, options: list[dict] | None = None) -> Obs:
        """Reset `env_ids` (seed: int -> env i gets `seed + i`, or one seed per entry; `options[j]`, e.g.
        {"state": flat}); returns all obs."""
        env_ids = [int(i) for i in env_ids]
        if options is not None and len(options) != len(env_ids):
            raise ValueError(f"options has {len(options)} entries for {len(env_ids)} env_ids")
        seeds = per_env_seeds(env_ids, seed)
        with self._warp_scope():
            fresh = self._reset_worlds(env_ids, seeds, options)
        if self._obs is None:
            self._obs = fresh
        else:
            self._obs = self._merge(self._obs, fresh, self._mask(env_ids))
        return self._obs

    def step_async(self, actions: torch.Tensor | np.ndarray, active: np.ndarray | None = None) -> None:
        """VecEnv's interface for stepping while the caller works on; the worlds step in `step_wait` (a step
        holds the caller's thread either way: it launches the kernels)."""
        self._pending = (actions, active)

    def step_wait(self) -> StepResult:
        """The StepResult of the `step_async` call before."""
        if self._pending is None:
            raise RuntimeError("step_wait called without step_async")
        (actions, active), self._pending = self._pending, None
        return self.step(actions, active)

    def step(self, actions: torch.Tensor | np.ndarray, active: np.ndarray | None = None) -> StepResult:
        """actions [B, 7] in [-1, 1] (clipped). Envs with `active[i] == False` keep their state (reward 0, no flags)."""
        if self._obs is None:
            raise RuntimeError("call reset() before step()")
        actions = torch.as_tensor(actions, dtype=torch.float32).to(self.device)
        if actions.shape != (self.num_envs, self.action_dim):
            raise ValueError(f"actions must have shape {(self.num_envs, self.action_dim)}, got {tuple(actions.shape)}")
        idle = None if active is None else ~torch.as_tensor(active, dtype=torch.bool, device=self.device)
        if idle is not None and not idle.any():
            idle = None

        with self._warp_scope():
            self._actions.copy_(actions.clamp(-1.0, 1.0))
            saved = None if idle is None else [s[idle].clone() for s in self._state]
            self._control_step()
            if saved is not None:
                for view, values in zip(self._state, saved):
                    view[idle] = values
            next_obs = self._observe()
            success = self.task.success(self._xpos, self._site_xpos[:, self.robot.eef_site])

        stepped = torch.ones_like(success) if idle is None else ~idle
        if idle is not None:
            next_obs = self._merge(next_obs, self._obs, idle)
        success &= stepped
        self._t += stepped.long()
        terminated = success & self.spec.terminate_on_success
        truncated = (self._t >= self.spec.horizon) & ~terminated & stepped
        reward = success.float()

        obs = next_obs
        done = terminated | truncated
        if self.autoreset and bool(done.any()):
            ids = done.nonzero().flatten().tolist()
            # Per-env seed streams, as the subprocess VecEnv: env i's k-th episode gets seed0 + i + k * B.
            seeds = [None if self._episode_seeds[i] is None else self._episode_seeds[i] + self.num_envs for i in ids]
            with self._warp_scope():
                obs = self._merge(next_obs, self._reset_worlds(ids, seeds, None), done)
        self._obs = obs
        return StepResult(obs=obs, reward=reward, terminated=terminated, truncated=truncated,
                          success=success, next_obs=next_obs, lost=torch.zeros_like(success))

    def render(
        self, env_ids: list[int] | None = None, camera: str = "agentview", size: int | None = None
    ) -> np.ndarray:
        """Upright frames [n, H, W, 3] uint8 of `env_ids` (default all), by MuJoCo's OpenGL renderer."""
        ids = list(range(self.num_envs)) if env_ids is None else list(env_ids)
        size = size or self.spec.render_size or 128
        if self._frame_renderer is None:
            self._frame_renderer = FrameRenderer(self.mjm)
        qpos = self._qpos[ids].double().cpu().numpy()
        return np.stack([self._frame_renderer.render(q, camera, size) for q in qpos])

    def close(self) -> None:
        if self._frame_renderer is not None:
            self._frame_renderer.close()
            self._frame_renderer = None
        self._camera_renderer = None
        self._graph = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- physics ---------------------------------------------------------------------------------
    def _control_step(self) -> None:
        if self._graph is not None:
            wp.capture_launch(self._graph)
        else:
            self._control_step_kernels()

    def _control_step_kernels(self) -> None:
        m, d, p = self.m, self.d, self.params
        for substep in range(self.robot.substeps):
            mjw.step1(m, d)
            if substep == 0:  # robosuite sets the controller goal once per policy step
                wp.launch(osc.set_goal, dim=self.num_envs,
                          inputs=[p, self.actions, d.site_xpos, d.site_xmat],
                          outputs=[self.goal_pos, self.goal_ori])
            wp.launch(osc.osc_torques, dim=self.num_envs,
                      inputs=[p, self.actions, d.qpos, d.qvel, d.qM, d.qfrc_bias, d.xanchor, d.xaxis,
                              d.site_xpos, d.site_xmat, self.goal_pos, self.goal_ori, self.q_init],
                      outputs=[self.gripper_cmd, d.ctrl])
            mjw.step2(m, d)

    def _capture_control_step(self):
        """CUDA: compile by running once (before any reset, so state does not matter), then capture."""
        with wp.ScopedDevice(self.wp_device):
            self._control_step_kernels()
            wp.synchronize_device(self.wp_device)
            with wp.ScopedCapture(device=self.wp_device) as capture:
                self._control_step_kernels()
        return capture.graph

    def _warp_scope(self):
        """Warp launches on torch's current stream, so torch and Warp work on shared memory stays ordered."""
        if not self.wp_device.is_cuda:
            return wp.ScopedDevice(self.wp_device)
        stack = contextlib.ExitStack()
        stack.enter_context(wp.ScopedDevice(self.wp_device))
        stack.enter_context(wp.ScopedStream(wp.stream_from_torch(torch.cuda.current_stream(self.device))))
        return stack

    def _osc_params(self) -> osc.OscParams:
        r = self.robot
        p = osc.OscParams()
        p.kp, p.kd, p.action_scale = osc.vec6(*r.kp), osc.vec6(*r.kd), osc.vec6(*r.action_scale)
        p.torque_min, p.torque_max = osc.vec7(*r.torque_min), osc.vec7(*r.torque_max)
        p.nullspace_kp, p.nullspace_kd = NULLSPACE_KP, 2.0 * float(np.sqrt(NULLSPACE_KP))
        p.eef_site = r.eef_site
        p.arm_jnt0, p.arm_dof0, p.arm_qpos0, p.arm_act0 = r.arm_jnt0, r.arm_dof0, r.arm_qpos0, r.arm_act0
        p.gripper_speed = r.gripper_speed
        p.gripper_act = wp.vec2i(*r.gripper_act)
        p.gripper_bias, p.gripper_weight = wp.vec2(*r.gripper_ctrl_bias), wp.vec2(*r.gripper_ctrl_weight)
        return p

    def _reset_worlds(self, env_ids: list[int], seeds: list[int | None], options: list[dict] | None) -> Obs:
        """robosuite's soft reset (`mj_resetData`, robot + object placement, controller reset) of `env_ids`;
        returns the observation of every world (only those of `env_ids` are meaningful)."""
        mask = self._mask(env_ids)
        mjw.reset_data(self.m, self.d, reset=wp.from_torch(mask))
        qpos = []
        for i, seed in zip(env_ids, seeds):
            if seed is not None:
                self._rngs[i] = np.random.RandomState(seed)
            self._episode_seeds[i] = seed
            qpos.append(self.task.initial_qpos(self.robot, self._qpos0, self._rngs[i]))
        self._qpos[env_ids] = torch.as_tensor(np.stack(qpos), dtype=torch.float32, device=self.device)
        self._update_kinematics()

        # Controller reset: nullspace posture = reset joints; goal = reset eef pose. The gripper command
        # is kept, as robosuite keeps PandaGripper.current_action across soft resets (hard_reset=False).
        arm = slice(self.robot.arm_qpos0, self.robot.arm_qpos0 + osc.NUM_ARM_JOINTS)
        self._q_init[env_ids] = self._qpos[env_ids, arm]
        self._goal_pos[env_ids] = self._site_xpos[env_ids, self.robot.eef_site]
        self._goal_ori[env_ids] = self._site_xmat[env_ids, self.robot.eef_site]
        self._t[env_ids] = 0

        # A stored state ({"state": [time, qpos, qvel]}) replaces the sampled one after the controller
        # reset, as RobosuiteEnv.reset(options) / robomimic's reset_to do.
        states = [(i, o["state"]) for i, o in zip(env_ids, options or []) if o and o.get("state") is not None]
        if states:
            nq, nv = self.mjm.nq, self.mjm.nv
            ids = [i for i, _ in states]
            flat = torch.as_tensor(np.stack([np.asarray(s, np.float64) for _, s in states]), dtype=torch.float32)
            if flat.shape[1] != 1 + nq + nv:
                raise ValueError(f"options state must be [time, qpos ({nq}), qvel ({nv})], got length {flat.shape[1]}")
            flat = flat.to(self.device)
            self._time[ids] = flat[:, 0]
            self._qpos[ids] = flat[:, 1 : 1 + nq]
            self._qvel[ids] = flat[:, 1 + nq :]
            self._update_kinematics()
        return self._observe()

    def _update_kinematics(self) -> None:
        """Poses of bodies, sites, geoms and cameras from qpos (what robosuite's post-reset forward gives obs)."""
        mjw.kinematics(self.m, self.d)
        mjw.com_pos(self.m, self.d)
        mjw.camlight(self.m, self.d)

    # -- observations ----------------------------------------------------------------------------
    def _observation_functions(self, keys: tuple[str, ...]) -> dict:
        r = self.robot
        arm = slice(r.arm_qpos0, r.arm_qpos0 + osc.NUM_ARM_JOINTS)
        arm_dofs = slice(r.arm_dof0, r.arm_dof0 + osc.NUM_ARM_JOINTS)
        gripper = torch.as_tensor(r.gripper_qpos_adr, device=self.device)
        available = {
            "object": lambda: self.task.object_obs(self._xpos, self._xquat, self._site_xpos[:, r.eef_site],
                                                   self._xquat[:, r.eef_body]),
            "robot0_eef_pos": lambda: self._site_xpos[:, r.eef_site],
            "robot0_eef_quat": lambda: self._xquat[:, r.eef_body][:, [1, 2, 3, 0]],
            "robot0_gripper_qpos": lambda: self._qpos[:, gripper],
            "robot0_joint_pos": lambda: self._qpos[:, arm],
            "robot0_joint_pos_cos": lambda: torch.cos(self._qpos[:, arm]),
            "robot0_joint_pos_sin": lambda: torch.sin(self._qpos[:, arm]),
            "robot0_joint_vel": lambda: self._qvel[:, arm_dofs],
        }
        missing = [k for k in keys if k not in available]
        if missing:
            raise ValueError(f"env.backend=warp cannot observe {missing}; available keys: {list(available)}")
        return {k: available[k] for k in keys}

    def _observe(self) -> Obs:
        """Current observation of every world: low-dim float32 [B, d], images uint8 [B, 3, H, W], task_id."""
        # Copies: observations must not alias the simulator's arrays, which the next step overwrites.
        obs = {k: fn().clone() for k, fn in self._obs_fns.items()}
        if self._camera_renderer is not None:
            images = self._camera_renderer.render(self.m, self.d, self.device)
            for key in self.spec.rgb_keys:
                obs[key] = images[camera_of(key)]
        obs[TASK_KEY] = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        return obs

    def _mask(self, env_ids: list[int]) -> torch.Tensor:
        mask = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        mask[env_ids] = True
        return mask

    @staticmethod
    def _merge(base: Obs, override: Obs, mask: torch.Tensor) -> Obs:
        """Per env: `override` where mask[i], else `base`."""
        return {k: torch.where(mask.view(-1, *[1] * (v.dim() - 1)), override[k], v) for k, v in base.items()}
