//! The HTB hierarchy of `htb` mode ([`HtbPlan`]): compiled from the validated policy next to
//! the table (classes steer their packets into its leaves through `skb->priority`), installed
//! as it is by the agent (`paceline::qdisc::install_htb`) on every managed interface.

use super::validate::Validated;

pub const HTB_MAJOR: u16 = 1;
/// The root class `1:1`; its parent is the qdisc (`parent_minor` 0).
pub const HTB_ROOT_MINOR: u16 = 0x1;
/// `1:100 + level index`: a rate-limited level.
pub const HTB_LEVEL_BASE: u16 = 0x100;
/// `1:200 + class index`: a class with a class_rate.
pub const HTB_CLASS_BASE: u16 = 0x200;
/// `1:300 + level index`: a level's other traffic.
pub const HTB_OTHER_BASE: u16 = 0x300;

/// The HTB hierarchy of HTB mode; the agent installs it with `tc` on every interface:
/// `tc qdisc add dev X root handle 1: htb default <default_minor>`, then each class in order
/// (parents come first) with `parent 1:<parent_minor>` (`parent 1:` when it is 0). At a reload
/// the classes are replaced in place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HtbPlan {
    /// The link rate, bytes/s.
    pub root_rate: u64,
    /// The leaf of the default class: where packets without our class id go.
    pub default_minor: u16,
    /// Root first, then per level: its class (if limited), its policy classes' leaves, its
    /// other-traffic leaf.
    pub classes: Vec<HtbClass>,
}

/// One class of the tree under root handle `1:`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HtbClass {
    pub classid_minor: u16,
    /// 0 = the qdisc itself.
    pub parent_minor: u16,
    /// Bytes/s.
    pub rate: u64,
    pub ceil: u64,
    /// 0 = highest (the level index).
    pub prio: u8,
    /// What the class is for (`level/web`, `class/memcached`), for reports.
    pub name: String,
}

impl HtbPlan {
    /// Is `minor` a leaf (a class packets are steered into)?
    pub fn is_leaf(&self, minor: u16) -> bool {
        !self.classes.iter().any(|c| c.parent_minor == minor)
    }
}

/// The HTB hierarchy for `v` (see [`HtbPlan`]); `None` without a link rate.
pub(super) fn htb_plan(v: &Validated, idx: &[u16]) -> Option<HtbPlan> {
    let root = v.link_rate.as_ref()?.rate;
    let mut classes = vec![HtbClass {
        classid_minor: HTB_ROOT_MINOR,
        parent_minor: 0,
        rate: root,
        ceil: root,
        prio: 0,
        name: "root".into(),
    }];
    for (li, l) in v.levels.iter().enumerate() {
        let prio = li as u8;
        let parent = match l.rate {
            Some(r) => {
                let minor = HTB_LEVEL_BASE + li as u16;
                classes.push(HtbClass {
                    classid_minor: minor,
                    parent_minor: HTB_ROOT_MINOR,
                    rate: r,
                    ceil: r,
                    prio,
                    name: format!("level/{}", l.name),
                });
                minor
            }
            None => HTB_ROOT_MINOR,
        };
        for (ci, c) in v.classes.iter().enumerate() {
            if let (true, Some(cr)) = (c.level == li, c.class_rate) {
                classes.push(HtbClass {
                    classid_minor: HTB_CLASS_BASE + idx[ci],
                    parent_minor: parent,
                    rate: cr,
                    ceil: cr,
                    prio,
                    name: format!("class/{}", c.name),
                });
            }
        }
        let other = l.rate.unwrap_or(root);
        classes.push(HtbClass {
            classid_minor: HTB_OTHER_BASE + li as u16,
            parent_minor: parent,
            rate: other,
            ceil: other,
            prio,
            name: format!("level/{}/other", l.name),
        });
    }
    Some(HtbPlan {
        root_rate: root,
        default_minor: htb_leaf(v, v.default_class, idx),
        classes,
    })
}

/// The HTB leaf a class's packets go to.
pub(super) fn htb_leaf(v: &Validated, class: usize, idx: &[u16]) -> u16 {
    let c = &v.classes[class];
    if c.class_rate.is_some() {
        HTB_CLASS_BASE + idx[class]
    } else {
        HTB_OTHER_BASE + c.level as u16
    }
}
