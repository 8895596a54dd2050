//! Process trees. A program that forks workers (a shell script, a
//! multiprocess interpreter) is measured with its descendants as one unit, so
//! that pages they share after fork count once. Descendants are found from the
//! parent PID in every /proc/PID/stat: this needs no kernel option (unlike
//! /proc/PID/task/TID/children) and sees children of every thread. The list
//! is a snapshot: a process forked or reaped right after it is missed or
//! measured as exited, which measurement tolerates.

use std::collections::HashMap;
use std::fs;

use crate::error::Error;
use crate::procfs;

/// `root` followed by all its living descendants, parents before children.
pub fn process_tree(root: u32) -> Result<Vec<u32>, Error> {
    procfs::read_stat(root)?;
    let children = children_by_parent();
    let mut tree = vec![root];
    let mut next = 0;
    while let Some(&pid) = tree.get(next) {
        next += 1;
        if let Some(kids) = children.get(&pid) {
            // Each PID is listed under one parent only, so the walk can only
            // come back to the root (a racy snapshot with a reused PID).
            tree.extend(kids.iter().filter(|k| **k != root));
        }
    }
    Ok(tree)
}

/// Every process in /proc, grouped under its parent.
fn children_by_parent() -> HashMap<u32, Vec<u32>> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return children;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // Gone since the directory was listed: not part of the tree.
        if let Ok(stat) = procfs::read_stat(pid) {
            children.entry(stat.ppid).or_default().push(pid);
        }
    }
    children
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_contains_spawned_child() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let me = std::process::id();
        let tree = process_tree(me).unwrap();
        assert_eq!(tree[0], me);
        assert!(tree.contains(&child.id()));
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
