//! What kind of physical addresses this process sees.
//!
//! Inside a virtual machine pagemap's PFNs are guest-physical: the
//! hypervisor maps them onto host pages it chooses, so the bank functions of
//! the real memory controller apply to addresses this process never sees.
//! If the host backs guest memory with 2 MiB pages, guest and host addresses
//! agree in bits 0-20 and functions of those bits alone still hold; bits above
//! are unknown. The CPUID "hypervisor present" bit says which case applies.

use serde::Serialize;

/// The CPU and whether it runs under a hypervisor.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub family: u32,
    pub model: u32,
    pub model_name: String,
    /// CPUID leaf 1 ECX bit 31: a hypervisor presents this CPU.
    pub hypervisor: bool,
    /// The hypervisor's vendor string (CPUID leaf 0x40000000), if any.
    pub hypervisor_vendor: Option<String>,
    /// pagemap shows real PFNs to this process (root).
    pub pfns_visible: bool,
}

impl Machine {
    pub fn probe() -> Machine {
        let (family, model) = cpu_family_model();
        Machine {
            family,
            model,
            model_name: model_name(),
            hypervisor: hypervisor_present(),
            hypervisor_vendor: hypervisor_vendor(),
            pfns_visible: crate::pfn::visible(),
        }
    }

    /// Whether PFNs name host-physical memory (not a guest's view of it).
    pub fn addresses_real(&self) -> bool {
        self.pfns_visible && !self.hypervisor
    }
}

/// CPUID display family and model (0, 0 off x86-64).
pub fn cpu_family_model() -> (u32, u32) {
    #[cfg(target_arch = "x86_64")]
    {
        let eax = core::arch::x86_64::__cpuid(1).eax;
        let base_family = (eax >> 8) & 0xf;
        let family = if base_family == 0xf {
            base_family + ((eax >> 20) & 0xff)
        } else {
            base_family
        };
        let model = if base_family == 6 || base_family == 0xf {
            ((eax >> 16) & 0xf) << 4 | ((eax >> 4) & 0xf)
        } else {
            (eax >> 4) & 0xf
        };
        (family, model)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        (0, 0)
    }
}

fn hypervisor_present() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        core::arch::x86_64::__cpuid(1).ecx >> 31 & 1 == 1
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|s| s.contains("hypervisor"))
    }
}

fn hypervisor_vendor() -> Option<String> {
    #[cfg(target_arch = "x86_64")]
    {
        if !hypervisor_present() {
            return None;
        }
        // With the hypervisor bit set, leaf 0x40000000 is the hypervisor's vendor leaf.
        let r = core::arch::x86_64::__cpuid(0x4000_0000);
        let bytes: Vec<u8> = [r.ebx, r.ecx, r.edx]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .filter(|&b| b != 0)
            .collect();
        Some(String::from_utf8_lossy(&bytes).trim().to_string())
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

fn model_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default()
}
