# The TOML config of one cellmesh role, rendered from its template here
# (cell, router, edge, control-plane). No resources: the role modules use
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

output "toml" {
  value     = templatefile("${path.module}/${var.role}.toml.tftpl", var.vars)
  sensitive = true
}
