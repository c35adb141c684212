"""Why a search scorer picks well or badly: each candidate's true value, measured in the simulator.

At M states along the policy's own rollouts, the planner proposes its N candidate actions; each is
executed from the restored MuJoCo state and the policy finishes the episode, R times
(`robo_rl/eval/oracle.py`). Every scorer is then judged on the same candidates:

  chosen_value   mean true success (and discounted return) of the candidate each scorer picks:
                 policy (a random candidate: the policy's own sample), best_of_n (argmax of the
                 critic, depth 0), tree_value (argmax of QWM's model-based value), qwm (the
                 planner's pick), oracle (the best candidate by its measured value; an upper bound,
                 optimistic by the noise of R rollouts), oracle_cv (R >= 2: picked by half the rollouts,
                 valued on the other half, so without that optimism)
  candidate_spread  (R >= 2) sd of the candidates' true success (and return) at a state, apart from
                 the rollout noise (random-effects ANOVA), and the states where every rollout of every
                 candidate ended alike: near 0, no scorer can gain by choosing among these candidates
  spearman       rank correlation, over a state's candidates, of each score with the true
                 discounted return, averaged over the states whose candidates differ
  pick_bias      per action dimension, how far each scorer's pick sits from its state's candidates'
                 mean, in units of their std, averaged over states: a scorer whose picks lean the
                 same way at every state drifts the robot even when each step's choice looks harmless
  latent_error   world model vs the encoder's latents of the real next observations, by depth
                 (mean squared error per latent dimension, over ensemble heads), beside the error
                 of predicting "no change" (latent_error_copy), which gives it a scale
  q_calibration  Q(s_t, a_t) of the visited states against the Monte-Carlo discounted return the
                 rollout got: least-squares slope, bias, correlation

    python benchmarks/search_oracle.py --checkpoint RUN_DIR --json OUT.json [--states 50 --rollouts 2]
        [--envs 2] [--set depth=3 pessimism=1 ...]   (planner overrides)

Writes OUT.json, OUT.png (the four panels) and OUT.npz (candidates, scores and true values per rollout, so other
scorers can be judged on the same measurements without re-running the simulator). On LIBERO the
same command works on an image checkpoint: `visit_states` seeds episodes from the suite's tasks
through the env's own resets, and snapshots restore the robosuite env LIBERO wraps; budget a
LIBERO env at ~5 steps/s with cameras, so use --states 10 --rollouts 1 there.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from einops import rearrange
from omegaconf import OmegaConf
from scipy import stats

from robo_rl.checkpoint import agent_from_checkpoint, build_planner, load_checkpoint
from robo_rl.envs import make_vec_env
from robo_rl.envs.vector import stack_obs
from robo_rl.eval.oracle import action_values, candidate_spread, cross_validated_best, visit_states
from robo_rl.eval.runner import qwm_planner_config
from robo_rl.planning.actor import AgentActor
from robo_rl.planning.qwm import candidate_deviation


def mean_spearman(scores: np.ndarray, truth: np.ndarray) -> tuple[float, int]:
    """Mean over states of the rank correlation of scores [S, N] with truth [S, N]; states whose truth
    or scores are all equal are skipped. Returns (mean, states used)."""
    rhos = [stats.spearmanr(s, t).statistic for s, t in zip(scores, truth) if np.ptp(t) > 0 and np.ptp(s) > 0]
    return (float(np.mean(rhos)) if rhos else float("nan")), len(rhos)


def _chunks(actions: np.ndarray, horizon: int) -> np.ndarray:
    """The real actions [d*h (+ rest), A] as the chunks the critic and world model take, [d, h*A] (rest dropped)."""
    whole = len(actions) // horizon * horizon
    return rearrange(actions[:whole], "(d h) a -> d (h a)", h=horizon)


@torch.no_grad()
def latent_errors(agent, visited, depth: int) -> tuple[list[float], list[float]]:
    """World-model error at depths 1..D against the encoder's latents of the real observations (the space
    it is trained to predict in), and the error of the "no change" prediction, both mean squared error
    per latent dimension. With chunks of h actions a depth is one chunk: the observation h env steps on."""
    h = agent.config.action_horizon
    model_err, copy_err = [[] for _ in range(depth)], [[] for _ in range(depth)]
    for v in visited:
        chunks = torch.as_tensor(_chunks(v.future_actions, h), device=agent.device)  # [d, h*A]
        if not len(chunks):
            continue
        z0 = agent.encode(stack_obs([v.obs]))  # [1, Z]
        targets = agent.encode(stack_obs(v.future_obs[h - 1::h][:len(chunks)]))  # [d, Z]
        z = agent.world_model.dynamics(z0, chunks[:1])  # [E, 1, Z]
        for d in range(len(chunks)):
            if d > 0:
                z = agent.world_model._step(z, chunks[d:d + 1])
            model_err[d].append(float((z[:, 0] - targets[d]).pow(2).mean()))
            copy_err[d].append(float((z0[0] - targets[d]).pow(2).mean()))
    return [float(np.mean(e)) for e in model_err if e], [float(np.mean(e)) for e in copy_err if e]


def pick_bias(candidates: np.ndarray, index: np.ndarray) -> list[float]:
    """candidates [M, N, A], chosen index [M] -> [A]: mean of (pick - candidates' mean) / their std, the lean
    the planner's drift guard keeps from adding up."""
    offset = candidate_deviation(torch.as_tensor(candidates))[np.arange(len(index)), index]  # [M, A]
    return offset.mean(0).numpy().round(3).tolist()


@torch.no_grad()
def q_calibration(agent, visited, pessimism: float) -> tuple[dict, np.ndarray, np.ndarray]:
    """Least-squares fit of Q(s_t, a_t) against the Monte-Carlo return; also the points (mc, q)."""
    h = agent.config.action_horizon
    rows = [v for v in visited if len(v.future_actions) >= h]
    z = agent.encode(stack_obs([v.obs for v in rows]))
    a = torch.as_tensor(np.stack([_chunks(v.future_actions, h)[0] for v in rows]), device=agent.device)  # [M, h*A]
    q = agent.q(z, a, pessimism).float().cpu().numpy()
    mc = np.array([v.mc_return for v in rows])
    slope = bias = r = float("nan")  # every rollout returning alike (a policy that never succeeds): nothing to fit
    if np.ptp(mc) > 0:
        fit = stats.linregress(mc, q)
        slope, bias, r = float(fit.slope), float(fit.intercept), float(fit.rvalue)
    return {"slope": slope, "bias": bias, "r": r, "states": len(rows),
            "mean_q": float(q.mean()), "mean_mc_return": float(mc.mean())}, mc, q


def plot(result: dict, q_points: tuple[np.ndarray, np.ndarray], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    names = list(result["chosen_value"])
    axes[0].bar(names, [result["chosen_value"][n] for n in names], color="tab:blue")
    axes[0].set_title(f"true success of the chosen candidate\n({result['states']} states, {result['rollouts']} rollouts)")
    axes[0].set_ylim(0, 1)
    sp = result["spearman"]
    axes[1].bar(list(sp), [sp[k] for k in sp], color="tab:orange")
    axes[1].axhline(0, color="k", lw=0.5)
    axes[1].set_title("Spearman(score, true return) over candidates")
    depths = np.arange(1, len(result["latent_error"]) + 1)
    axes[2].plot(depths, result["latent_error"], "o-", label="world model")
    axes[2].plot(depths, result["latent_error_copy"], "s--", label="no change")
    axes[2].set_xlabel("depth")
    axes[2].set_title("latent error vs the encoder")
    axes[2].legend()
    mc, q = q_points
    axes[3].scatter(mc, q, s=10)
    cal = result["q_calibration"]
    xs = np.linspace(0, max(1e-3, mc.max()), 10)
    axes[3].plot(xs, cal["slope"] * xs + cal["bias"], "r-", label=f"Q = {cal['slope']:.2f}·MC + {cal['bias']:.2f}")
    axes[3].plot(xs, xs, "k:", label="calibrated")
    axes[3].set_xlabel("Monte-Carlo return")
    axes[3].set_ylabel("Q(s, a)")
    axes[3].legend()
    axes[3].set_title("critic calibration")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a run directory or a step_*.pt file")
    parser.add_argument("--json", required=True, help="write the results here (and .png, .npz beside it)")
    parser.add_argument("--states", type=int, default=50, help="M visited states")
    parser.add_argument("--rollouts", type=int, default=2, help="R rollouts per candidate")
    parser.add_argument("--envs", type=int, default=2, help="env worker processes")
    parser.add_argument("--seed", type=int, default=20_000, help="seed of the visiting episodes")
    parser.add_argument("--set", nargs="*", default=[], help="planner overrides, e.g. depth=3 pessimism=1")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads: 1, as two spinning intra-op threads starve the env workers on 2 cores")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.time()

    state = load_checkpoint(args.checkpoint)
    cfg = OmegaConf.create(state["config"])
    cfg.planner = OmegaConf.merge(qwm_planner_config(cfg.planner), OmegaConf.from_dotlist(args.set))
    gamma = cfg.train.gamma  # the critic's discount, which the search uses too
    planner = build_planner(cfg.planner, gamma)
    agent = agent_from_checkpoint(state)
    agent.eval()
    policy = AgentActor(agent, seed=args.seed)
    kappa = planner.cfg.pessimism

    env = make_vec_env(cfg, num_envs=args.envs, autoreset=False)
    try:
        depth = max(1, planner.cfg.depth)  # in chunks: the real steps that follow a state are depth * h
        visited = visit_states(env, policy, args.states, args.seed, gamma, depth=depth * agent.config.action_horizon)
        print(f"[oracle] {len(visited)} states visited ({time.time() - t0:.0f} s)")
        with torch.no_grad():
            z = agent.encode(stack_obs([v.obs for v in visited]))
            wm = agent.world_model
            _, info = planner.plan(z, agent.pi,
                                   lambda zz, aa: agent.q(zz, aa, kappa), wm.next)
        candidates = info["candidates"].float().cpu().numpy()  # [M, N, h*A]
        success_runs, returns_runs = action_values(env, visited, candidates, policy, args.rollouts, gamma)
    finally:
        env.close()
    print(f"[oracle] candidates measured ({time.time() - t0:.0f} s)")

    success, returns = success_runs.mean(2), returns_runs.mean(2)  # [M, N]
    rows = np.arange(len(visited))
    q, score = info["q"].float().cpu().numpy(), info["scores"].float().cpu().numpy()
    picks = {"best_of_n": q.argmax(1), "qwm": info["index"].cpu().numpy()}
    scores = {"q": q, "score": score}
    if "tree_value" in info:
        scores["tree_value"] = info["tree_value"].float().cpu().numpy()
        picks["tree_value"] = scores["tree_value"].argmax(1)
    chosen = {"policy": float(success.mean())} | {k: float(success[rows, i].mean()) for k, i in picks.items()}
    chosen["oracle"] = float(success.max(1).mean())
    chosen_return = {"policy": float(returns.mean())} | {k: float(returns[rows, i].mean()) for k, i in picks.items()}
    chosen_return["oracle"] = float(returns.max(1).mean())
    spread = {}
    if args.rollouts >= 2:
        chosen["oracle_cv"] = cross_validated_best(success_runs)
        chosen_return["oracle_cv"] = cross_validated_best(returns_runs)
        spread = {"success": candidate_spread(success_runs), "return": candidate_spread(returns_runs)}
    spearman = {k: mean_spearman(s, returns) for k, s in scores.items()}
    model_err, copy_err = latent_errors(agent, visited, depth)
    calibration, mc, q_taken = q_calibration(agent, visited, kappa)
    result = {
        "checkpoint": str(args.checkpoint), "task": cfg.task.name, "states": len(visited), "rollouts": args.rollouts,
        "candidates": int(candidates.shape[1]), "planner": OmegaConf.to_container(cfg.planner),
        "chosen_value": chosen, "chosen_return": chosen_return,
        "spearman": {k: v[0] for k, v in spearman.items()},
        "spearman_states": {k: v[1] for k, v in spearman.items()},
        "candidate_spread": spread,
        "pick_bias": {k: pick_bias(candidates, i) for k, i in picks.items()},
        "latent_error": model_err, "latent_error_copy": copy_err, "q_calibration": calibration,
        "wall_s": time.time() - t0,
    }
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    np.savez(out.with_suffix(".npz"), candidates=candidates, success=success_runs, returns=returns_runs,
             t=np.array([v.t for v in visited]), mc_return=np.array([v.mc_return for v in visited]),
             **{f"score_{k}": s for k, s in scores.items()}, index=picks["qwm"])
    plot(result, (mc, q_taken), out.with_suffix(".png"))

    print(f"{'scorer':<12}{'chosen success':>16}{'chosen return':>15}{'spearman':>10}")
    for name in chosen:
        key = {"best_of_n": "q", "qwm": "score", "tree_value": "tree_value"}.get(name)
        rho = f"{result['spearman'][key]:.3f}" if key else ""
        print(f"{name:<12}{chosen[name]:>16.3f}{chosen_return[name]:>15.3f}{rho:>10}")
    for name, bias in result["pick_bias"].items():
        print(f"pick bias {name:<11} (std units per action dim) {bias}")
    if spread:
        print(f"true success across a state's candidates: sd {spread['success']['between_sd']:.3f} between candidates, "
              f"{spread['success']['within_sd']:.3f} between rollouts of one; every rollout equal at "
              f"{spread['success']['states_all_equal']} of {len(visited)} states")
    print(f"latent error by depth {np.round(model_err, 4).tolist()} (no change: {np.round(copy_err, 4).tolist()})")
    print(f"Q calibration: Q = {calibration['slope']:.2f}·MC + {calibration['bias']:.2f} (r {calibration['r']:.2f})")
    print(f"-> {out} ({result['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
