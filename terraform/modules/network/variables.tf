variable "name" {
  description = "Deployment name, prefixed to every resource."
  type        = string
}

variable "region" {
  description = "The AWS region (names the private zone)."
  type        = string
}

variable "cidr" {
  description = "The VPC's address block (a /16 to a /20)."
  type        = string
  validation {
    condition     = can(cidrhost(var.cidr, 0)) && tonumber(split("/", var.cidr)[1]) >= 16 && tonumber(split("/", var.cidr)[1]) <= 20
    error_message = "cidr must be an IPv4 block from /16 to /20, e.g. 10.10.0.0/16."
  }
}

variable "internal_cidrs" {
  description = "Address blocks of every region (internal ports are open to them)."
  type        = list(string)
}

variable "internal_domain" {
  description = "Private DNS suffix: names are <process>.<region>.<internal_domain>."
  type        = string
  default     = "cellmesh.internal"
}

variable "ports" {
  description = "The edge's client port and the range of internal ports."
  type        = object({ edge = number, first = number, last = number })
  default     = { edge = 7200, first = 2379, last = 7499 }
}
