//! Running a system tool (mount, losetup, hdiutil...) as a command line built beforehand.
//!
//! Owns: how a tool is found (an absolute path as given; a bare name in PATH or the sbin
//! directories), run (no stdin; its output captured) and reported (a failure names the
//! command line, its exit status and what it printed on stderr). Must never: go through a
//! shell.

use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// A tool and its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCommand {
    pub program: &'static str,
    pub args: Vec<OsString>,
}

impl ToolCommand {
    pub fn new(program: &'static str) -> ToolCommand {
        ToolCommand {
            program,
            args: Vec::new(),
        }
    }

    /// Adds one argument.
    pub fn arg(mut self, arg: impl Into<OsString>) -> ToolCommand {
        self.args.push(arg.into());
        self
    }

    /// The arguments as text.
    #[cfg(test)]
    pub fn args_text(&self) -> Vec<String> {
        self.args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    /// Runs it and returns its standard output; a failure says what ran and what it said.
    pub fn run(&self) -> Result<String> {
        let program = if self.program.contains('/') {
            PathBuf::from(self.program)
        } else {
            lograid_nbd::attach::find_tool(self.program)
                .unwrap_or_else(|| PathBuf::from(self.program))
        };
        let output = Command::new(&program)
            .args(&self.args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running `{self}`"))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            bail!("`{self}` failed ({}): {}", output.status, stderr.trim());
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

impl fmt::Display for ToolCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.program)?;
        for arg in &self.args {
            write!(f, " {}", arg.to_string_lossy())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_tool_runs_without_a_shell_and_a_failure_names_it() {
        let out = ToolCommand::new("echo")
            .arg("a b;")
            .arg("$HOME")
            .run()
            .unwrap();
        assert_eq!(out, "a b; $HOME\n");
        let error = ToolCommand::new("ls")
            .arg("/nonexistent-lograid")
            .run()
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("`ls /nonexistent-lograid` failed"),
            "{error}"
        );
        assert!(error.contains("No such file"), "{error}");
        let missing = ToolCommand::new("/nonexistent/tool").run().unwrap_err();
        assert!(format!("{missing:#}").contains("running `/nonexistent/tool`"));
    }
}
