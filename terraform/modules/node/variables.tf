variable "name" {
  description = "Resource name of this process (deployment, region, role, id)."
  type        = string
}

variable "role" {
  description = "The `cellmesh` subcommand this instance runs."
  type        = string
  validation {
    condition     = contains(["cell", "router", "edge", "control-plane", "etcd"], var.role)
    error_message = "role must be one of cell, router, edge, control-plane, etcd."
  }
}

variable "config" {
  description = "The process's rendered TOML config (etcd: its environment file)."
  type        = string
  sensitive   = true
}

variable "host" {
  description = "The stable private DNS name of this process."
  type        = string
}

variable "zone_id" {
  description = "The private zone the name is recorded in."
  type        = string
}

variable "instance_type" {
  type = string
}

variable "ami_id" {
  description = "Empty: the latest Debian 12."
  type        = string
  default     = ""
}

variable "subnet_id" {
  type = string
}

variable "security_group_ids" {
  type = list(string)
}

variable "data_volume_gib" {
  description = "gp3 data volume size; 0 for none."
  type        = number
  default     = 0
  validation {
    condition     = var.data_volume_gib == 0 || (var.data_volume_gib >= 20 && var.data_volume_gib <= 16384)
    error_message = "data_volume_gib must be 0 (none) or between 20 and 16384 (gp3 limits)."
  }
}

variable "data_volume_iops" {
  type    = number
  default = 3000
}

variable "cellmesh_url" {
  description = "Where instances download the cellmesh binary."
  type        = string
}
