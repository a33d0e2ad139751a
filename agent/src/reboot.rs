//! Rebooting the machine once an install's report was delivered
//! (docs/spec/metropolis-install.md section 5): the machine then boots
//! what was installed, through the boot entry the install made.

use std::path::PathBuf;

/// How the agent has the machine reboot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RebootMethod {
    /// The kernel's `reboot(2)` (`RB_AUTOBOOT`) after `sync(2)`, as the
    /// reference agent does: immediate, no init system involved (the agent
    /// may be running without one). Needs `CAP_SYS_BOOT`.
    Kernel,
    /// Run this program (no arguments) and wait for it to exit 0, e.g. a
    /// script calling `systemctl reboot` on a host with an init system;
    /// tests use it to see the reboot without rebooting.
    Command(PathBuf),
}

/// Reboots the machine by `method`; returns once the reboot is under way
/// (a command that exited 0), or why it is not.
pub fn reboot(method: &RebootMethod) -> Result<(), String> {
    match method {
        RebootMethod::Kernel => kernel_reboot(),
        RebootMethod::Command(program) => {
            let status = std::process::Command::new(program)
                .status()
                .map_err(|e| format!("--reboot-command {}: {e}", program.display()))?;
            if status.success() {
                Ok(())
            } else {
                Err(format!(
                    "--reboot-command {} exited with {status}",
                    program.display()
                ))
            }
        }
    }
}

fn kernel_reboot() -> Result<(), String> {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    // SAFETY: reboot(2) with RB_AUTOBOOT takes no pointer; on success it
    // does not return.
    let rc = unsafe { libc::reboot(libc::RB_AUTOBOOT) };
    if rc == 0 {
        return Ok(());
    }
    Err(format!(
        "reboot(2) failed: {} (the agent needs CAP_SYS_BOOT; --reboot never turns reboots off)",
        std::io::Error::last_os_error()
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_command_reboots_when_it_exits_zero() {
        assert_eq!(reboot(&RebootMethod::Command("/bin/true".into())), Ok(()));
        let failed = reboot(&RebootMethod::Command("/bin/false".into())).unwrap_err();
        assert!(
            failed.contains("--reboot-command /bin/false exited"),
            "{failed}"
        );
        let missing = reboot(&RebootMethod::Command("/nonexistent/reboot".into())).unwrap_err();
        assert!(
            missing.starts_with("--reboot-command /nonexistent/reboot:"),
            "{missing}"
        );
    }
}
