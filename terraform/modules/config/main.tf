# The TOML config of one cellmesh role, rendered from its template here
# (cell, router, edge, control-plane), with the `[tls]` every role's
# internal links use. No resources: the role modules use
# it, and scripts/test-terraform.sh renders every template through it and
# runs `cellmesh <role> --check-config` on the result.

variable "role" {
  type = string
  validation {
    condition     = contains(["cell", "router", "edge", "control-plane"], var.role)
    error_message = "role must be one of cell, router, edge, control-plane."
  }
}

variable "vars" {
  description = "The template's variables."
  type        = any
}

variable "telemetry" {
  description = "Metrics and traces: the port `/metrics` listens on (scraped from the monitoring CIDRs only, see the network module), the OTLP/gRPC collector traces go to (empty: none) and the share of traces sampled."
  type = object({
    metrics_port  = optional(number, 9464)
    otlp_endpoint = optional(string, "")
    sample_ratio  = optional(number, 0.05)
  })
  default = {}
}

variable "tls" {
  description = "Where the process finds its certificate bundle: the files cloud-init writes from its secret (see ../node/tls.tf)."
  type = object({
    ca_file   = optional(string, "/etc/cellmesh/tls/ca.pem")
    cert_file = optional(string, "/etc/cellmesh/tls/node.pem")
    key_file  = optional(string, "/etc/cellmesh/tls/node.key")
    crl_file  = optional(string, "/etc/cellmesh/tls/crl.pem")
  })
  default = {}
}

locals {
  # Every internal link is mutual TLS: no shared secret, no plaintext.
  tls_section = <<-TOML

    [tls]
    ca_file = "${var.tls.ca_file}"
    cert_file = "${var.tls.cert_file}"
    key_file = "${var.tls.key_file}"
    crl_file = "${var.tls.crl_file}"
  TOML
}

output "toml" {
  value     = "${templatefile("${path.module}/${var.role}.toml.tftpl", merge(var.vars, { telemetry = var.telemetry }))}${local.tls_section}"
  sensitive = true
}
