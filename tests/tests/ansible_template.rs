//! The Ansible role's config template (ansible/roles/shoal_agent/templates/agent.toml.j2)
//! renders a config the agent accepts. `ansible/tests/run.sh` renders the template from fixed
//! sample variables and fails if the result differs from the committed
//! `ansible/tests/rendered-agent.toml`; this test checks that file against the agent's own
//! parser (unknown keys are errors) and value checks.

use shoal_agent::AgentConfig;

const RENDERED: &str = include_str!("../../ansible/tests/rendered-agent.toml");

#[test]
fn rendered_ansible_template_is_a_valid_agent_config() {
    let config = AgentConfig::parse(RENDERED).expect("the rendered template parses");
    config
        .validate_values()
        .expect("the rendered template's values are valid");

    // The values of ansible/tests/sample-vars.yml arrived where they belong.
    assert_eq!(config.node.name.as_deref(), Some("gpu-node-01"));
    assert_eq!(config.node.failure_domain, "rack-1");
    assert_eq!(config.node.data_dir, std::path::Path::new("/nvme0/shoal"));
    assert_eq!(config.admin.socket_mode, 0o660);
    assert_eq!(config.metrics.addr, None);
    assert_eq!(config.log.level, "shoal_mesh=debug,info");
    assert_eq!(config.meta.bootstrap_expect, 3);
    let r = config.resources.expect("the sample reserves resources");
    assert_eq!(r.cpus.as_deref(), Some("0-3"));
    assert_eq!(r.cpu_cores, None);
    assert_eq!(r.memory, "8GiB");
    assert_eq!(r.min_free_cores, 2.0);
    assert_eq!(r.min_free_memory, "16GiB");
    assert_eq!(r.enforcement, shoal_resource_guard::Enforcement::Required);
}
