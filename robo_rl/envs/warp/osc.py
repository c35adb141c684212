"""robosuite's OSC_POSE arm controller and Panda gripper mapping as Warp kernels, one thread per world.

Why Warp kernels rather than torch: robosuite recomputes the torques at every physics substep (25 per
control step), between the position/velocity stage (`step1`) and the acceleration/integration stage
(`step2`) of MuJoCo. One kernel launch per substep keeps a whole control step a plain sequence of Warp
launches, which on CUDA is captured once as a graph and replayed; a torch controller would be ~40
small batched ops per substep that cannot join that graph. Each world's 7x7 algebra stays in one
thread's registers.

The maths follows robosuite 1.4 `controllers/osc.py` (fixed impedance, delta control, uncoupled
position/orientation, no interpolator, no position/orientation limits) line by line:
  goal_pos = eef_pos + out_max[:3] * a[:3];  goal_ori = R(out_max[3:] * a[3:]) @ eef_ori
  (the orientation goal only changes when a rotation component is non-zero)
  F   = Lambda_pos (kp (goal_pos - x) - kd v)      T = Lambda_ori (kp ori_err - kd w)
  tau = J^T [F; T] + qfrc_bias + N^T M (kp_null (q_init - q) - kd_null qd),   clipped to the motor ranges
with Lambda_* = (J_* M^-1 J_*^T)^-1 and N = I - M^-1 J^T Lambda J. MuJoCo Warp computes in float32.
"""
from __future__ import annotations

from typing import Any

import warp as wp

NUM_ARM_JOINTS = 7

vec6 = wp.types.vector(length=6, dtype=wp.float32)
vec7 = wp.types.vector(length=NUM_ARM_JOINTS, dtype=wp.float32)
mat66 = wp.types.matrix(shape=(6, 6), dtype=wp.float32)
mat67 = wp.types.matrix(shape=(6, NUM_ARM_JOINTS), dtype=wp.float32)
mat77 = wp.types.matrix(shape=(NUM_ARM_JOINTS, NUM_ARM_JOINTS), dtype=wp.float32)


@wp.struct
class OscParams:
    """Controller constants read from robosuite's live controller and the compiled model."""

    kp: vec6
    kd: vec6
    action_scale: vec6  # output_max: action 1.0 -> 5 cm / 0.5 rad of goal offset
    torque_min: vec7
    torque_max: vec7
    nullspace_kp: float
    nullspace_kd: float
    eef_site: int
    arm_jnt0: int  # the arm's joints, dofs, qpos entries and motors are contiguous from these
    arm_dof0: int
    arm_qpos0: int
    arm_act0: int
    gripper_speed: float  # change of the gripper command per substep (robosuite: 0.01)
    gripper_act: wp.vec2i
    gripper_bias: wp.vec2
    gripper_weight: wp.vec2


# -- small dense linear algebra (SPD matrices, in place on value copies) ---------------------------
@wp.func
def cholesky(a: Any, n: int):
    """Lower Cholesky factor of SPD `a` (n x n) in the lower triangle; the upper triangle is unused."""
    l = a
    for j in range(n):
        s = l[j, j]
        for k in range(j):
            s -= l[j, k] * l[j, k]
        d = wp.sqrt(s)
        l[j, j] = d
        for i in range(j + 1, n):
            t = l[i, j]
            for k in range(j):
                t -= l[i, k] * l[j, k]
            l[i, j] = t / d
    return l


@wp.func
def cholesky_solve(l: Any, b: Any, n: int):
    """x with (L L^T) x = b."""
    x = b
    for i in range(n):
        t = x[i]
        for k in range(i):
            t -= l[i, k] * x[k]
        x[i] = t / l[i, i]
    for ii in range(n):
        i = n - 1 - ii
        t = x[i]
        for k in range(i + 1, n):
            t -= l[k, i] * x[k]
        x[i] = t / l[i, i]
    return x


@wp.func
def diagonal_block(m: mat66, start: int) -> wp.mat33:
    """The 3x3 block of `m` at rows and columns start..start+2."""
    block = wp.mat33()
    for i in range(3):
        for j in range(3):
            block[i, j] = m[start + i, start + j]
    return block


@wp.func
def column(m: wp.mat33, c: int) -> wp.vec3:
    return wp.vec3(m[0, c], m[1, c], m[2, c])


@wp.func
def orientation_error(desired: wp.mat33, current: wp.mat33) -> wp.vec3:
    """robosuite's axis-angle-like error between rotation matrices (sum of column cross products)."""
    e = wp.vec3(0.0)
    for c in range(3):
        e += wp.cross(column(current, c), column(desired, c))
    return 0.5 * e


@wp.func
def site_jacobian(
    p: OscParams, worldid: int, point: wp.vec3, xanchor: wp.array2d[wp.vec3], xaxis: wp.array2d[wp.vec3]
) -> mat67:
    """[J_pos; J_rot] of a point on the hand w.r.t. the arm's hinge joints (rows 0-2 linear, 3-5 angular)."""
    jac = mat67()
    for c in range(NUM_ARM_JOINTS):
        axis = xaxis[worldid, p.arm_jnt0 + c]
        lin = wp.cross(axis, point - xanchor[worldid, p.arm_jnt0 + c])
        for r in range(3):
            jac[r, c] = lin[r]
            jac[r + 3, c] = axis[r]
    return jac


# -- kernels ----------------------------------------------------------------------------------------
@wp.kernel
def set_goal(
    p: OscParams,
    actions: wp.array2d[float],  # [B, 7] in [-1, 1]
    site_xpos: wp.array2d[wp.vec3],
    site_xmat: wp.array2d[wp.mat33],
    goal_pos: wp.array[wp.vec3],
    goal_ori: wp.array[wp.mat33],
):
    """A new policy action: move the goal pose by the scaled delta from the current eef pose."""
    w = wp.tid()
    dpos = wp.vec3(actions[w, 0], actions[w, 1], actions[w, 2])
    drot = wp.vec3(actions[w, 3], actions[w, 4], actions[w, 5])
    for i in range(3):
        dpos[i] = dpos[i] * p.action_scale[i]
        drot[i] = drot[i] * p.action_scale[i + 3]
    goal_pos[w] = site_xpos[w, p.eef_site] + dpos
    angle = wp.length(drot)
    if angle > 0.0:  # robosuite keeps the previous orientation goal when the rotation action is exactly 0
        rot = wp.quat_to_matrix(wp.quat_from_axis_angle(drot / angle, angle))
        goal_ori[w] = rot @ site_xmat[w, p.eef_site]


@wp.kernel
def osc_torques(
    p: OscParams,
    gripper_actions: wp.array2d[float],  # [B, 7]: column 6 is the gripper action
    qpos: wp.array2d[float],
    qvel: wp.array2d[float],
    qM: wp.array3d[float],
    qfrc_bias: wp.array2d[float],
    xanchor: wp.array2d[wp.vec3],
    xaxis: wp.array2d[wp.vec3],
    site_xpos: wp.array2d[wp.vec3],
    site_xmat: wp.array2d[wp.mat33],
    goal_pos: wp.array[wp.vec3],
    goal_ori: wp.array[wp.mat33],
    q_init: wp.array[vec7],
    gripper_cmd: wp.array[float],  # [B] robosuite's PandaGripper.current_action = (-c, c); integrated here
    ctrl: wp.array2d[float],
):
    """One substep of control (after step1's kinematics, inertia and bias forces): write ctrl."""
    w = wp.tid()
    q = vec7()
    qd = vec7()
    mass = mat77()
    for i in range(NUM_ARM_JOINTS):
        q[i] = qpos[w, p.arm_qpos0 + i]
        qd[i] = qvel[w, p.arm_dof0 + i]
        for j in range(NUM_ARM_JOINTS):
            mass[i, j] = qM[w, p.arm_dof0 + i, p.arm_dof0 + j]

    eef = site_xpos[w, p.eef_site]
    jac = site_jacobian(p, w, eef, xanchor, xaxis)
    twist = jac @ qd

    # Lambda^-1 = J M^-1 J^T, column by column.
    chol_m = cholesky(mass, NUM_ARM_JOINTS)
    minv_jt = mat67()  # rows: M^-1 J_r^T
    for r in range(6):
        minv_jt[r] = cholesky_solve(chol_m, jac[r], NUM_ARM_JOINTS)
    lam_inv = jac @ wp.transpose(minv_jt)
    lam_pos = wp.inverse(diagonal_block(lam_inv, 0))
    lam_ori = wp.inverse(diagonal_block(lam_inv, 3))

    pos_err = goal_pos[w] - eef
    ori_err = orientation_error(goal_ori[w], site_xmat[w, p.eef_site])
    force = wp.vec3(0.0)
    moment = wp.vec3(0.0)
    for i in range(3):
        force[i] = p.kp[i] * pos_err[i] - p.kd[i] * twist[i]
        moment[i] = p.kp[i + 3] * ori_err[i] - p.kd[i + 3] * twist[i + 3]
    force = lam_pos @ force
    moment = lam_ori @ moment
    wrench = vec6(force[0], force[1], force[2], moment[0], moment[1], moment[2])

    # Nullspace posture torques: N^T g = g - J^T Lambda J M^-1 g, with g = M (kp (q0 - q) - kd qd).
    posture = mass @ (p.nullspace_kp * (q_init[w] - q) - p.nullspace_kd * qd)
    lam_j_minv_g = cholesky_solve(cholesky(lam_inv, 6), jac @ cholesky_solve(chol_m, posture, NUM_ARM_JOINTS), 6)
    tau = wp.transpose(jac) @ (wrench - lam_j_minv_g) + posture
    for i in range(NUM_ARM_JOINTS):
        ctrl[w, p.arm_act0 + i] = wp.clamp(
            tau[i] + qfrc_bias[w, p.arm_dof0 + i], p.torque_min[i], p.torque_max[i]
        )

    # Panda gripper: the command walks toward +-1 by `gripper_speed` per substep (sign of the action).
    g = gripper_actions[w, 6]
    step = wp.where(g > 0.0, p.gripper_speed, wp.where(g < 0.0, -p.gripper_speed, 0.0))  # np.sign: 0 at 0
    c = wp.clamp(gripper_cmd[w] + step, -1.0, 1.0)
    gripper_cmd[w] = c
    ctrl[w, p.gripper_act[0]] = p.gripper_bias[0] - p.gripper_weight[0] * c
    ctrl[w, p.gripper_act[1]] = p.gripper_bias[1] + p.gripper_weight[1] * c
