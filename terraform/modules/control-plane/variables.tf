variable "deployment" {
  type = string
}

variable "region" {
  type = string
}

variable "replicas" {
  description = "One is active; the others take over its operations."
  type        = number
  default     = 2
  validation {
    condition     = var.replicas >= 1 && var.replicas <= 5
    error_message = "control-plane replicas must be between 1 and 5."
  }
}

variable "routers" {
  type = list(string)
}

variable "etcd_endpoints" {
  type = list(string)
  validation {
    condition     = length(var.etcd_endpoints) > 0
    error_message = "the control plane elects its active replica through etcd: name its endpoints."
  }
}

variable "tls" {
  description = "The certificate bundles: the folder `cellmesh pki issue-all` wrote, the KMS key secrets are encrypted with, and the recovery window of a deleted secret (days; 0: none)."
  type = object({
    dir           = string
    kms_key_arn   = string
    recovery_days = optional(number, 7)
  })
}

variable "console_token" {
  description = "The console's read-only credential (HTTP basic password or bearer token): the console listens beyond loopback."
  type        = string
  sensitive   = true
  validation {
    condition     = length(var.console_token) >= 16
    error_message = "the console token must be at least 16 characters."
  }
}

variable "console_port" {
  type    = number
  default = 7100
}

variable "admin_port" {
  type    = number
  default = 7101
}

variable "zone_id" {
  type = string
}

variable "zone_name" {
  type = string
}

variable "subnet_ids" {
  type = list(string)
}

variable "security_group_ids" {
  type = list(string)
}

variable "instance_type" {
  type    = string
  default = "t3.medium"
}

variable "ami_id" {
  type    = string
  default = ""
}

variable "cellmesh_url" {
  type = string
}

variable "telemetry" {
  description = "Metrics port, OTLP endpoint and sample ratio (see ../config)."
  type        = any
  default     = {}
}
