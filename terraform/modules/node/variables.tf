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

variable "tls" {
  description = "This process's certificate bundle (etcd: none): the folder `cellmesh pki init` and `issue-all` wrote (`dir`), the file stem of its certificate (`cell-eu-west-1-c1`), the KMS key its secret is encrypted with, and how many days a deleted secret can be recovered (0: at once)."
  type = object({
    dir           = string
    stem          = string
    kms_key_arn   = string
    recovery_days = optional(number, 7)
  })
  default = null
  validation {
    condition     = var.tls == null || try(var.tls.recovery_days == 0 || (var.tls.recovery_days >= 7 && var.tls.recovery_days <= 30), false)
    error_message = "tls.recovery_days must be 0 or between 7 and 30 (Secrets Manager's limits)."
  }
}
