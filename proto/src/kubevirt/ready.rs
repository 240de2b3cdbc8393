//! The VMI's `Ready` condition as virt-controller derives it from the launcher pod
//! (KubeVirt v1.9.0 `syncReadyConditionFromPod`, `pkg/virt-controller/watch/vmi/`):
//! false until the guest runs, then the pod's own `Ready`. Shared by the controller and
//! the standalone mode's stand-in controller, so both say the same thing.

use super::Phase;

/// What the controller sees of the VMI's launcher pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LauncherPod<'a> {
    /// No pod (not created yet, or gone).
    Missing,
    /// The pod is down or going down (finished, or being deleted).
    GoingDown,
    /// The pod is up; its `Ready` condition as `(status, reason, message)`, if it has one.
    Up(Option<(&'a str, &'a str, &'a str)>),
}

/// `(status, reason, message)` of the VMI's `Ready` condition.
pub fn ready_condition(phase: Phase, pod: LauncherPod) -> (String, String, String) {
    let not = |reason: &str, message: &str| {
        ("False".to_string(), reason.to_string(), message.to_string())
    };
    match pod {
        LauncherPod::Missing => not(
            "PodNotExists",
            "virt-launcher pod has not yet been scheduled",
        ),
        LauncherPod::GoingDown => not("PodTerminating", "virt-launcher pod is terminating"),
        LauncherPod::Up(_) if phase != Phase::Running => {
            not("GuestNotRunning", "Guest VM is not reported as running")
        }
        LauncherPod::Up(Some((status, reason, message))) => {
            (status.to_string(), reason.to_string(), message.to_string())
        }
        LauncherPod::Up(None) => not(
            "PodConditionMissing",
            "virt-launcher pod is missing the Ready condition",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_while_running_with_a_ready_pod() {
        let ready = LauncherPod::Up(Some(("True", "", "")));
        assert_eq!(ready_condition(Phase::Running, ready).0, "True");
        for phase in [Phase::Scheduled, Phase::Succeeded, Phase::Failed] {
            let (status, reason, _) = ready_condition(phase, ready);
            assert_eq!(
                (status.as_str(), reason.as_str()),
                ("False", "GuestNotRunning")
            );
        }
        let cases = [
            (LauncherPod::Missing, "PodNotExists"),
            (LauncherPod::GoingDown, "PodTerminating"),
            (LauncherPod::Up(None), "PodConditionMissing"),
        ];
        for (pod, reason) in cases {
            let (status, got, _) = ready_condition(Phase::Running, pod);
            assert_eq!((status.as_str(), got.as_str()), ("False", reason));
        }
        let not_ready = LauncherPod::Up(Some(("False", "ContainersNotReady", "m")));
        assert_eq!(
            ready_condition(Phase::Running, not_ready).1,
            "ContainersNotReady"
        );
    }
}
