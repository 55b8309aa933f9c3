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

variable "metrics_port" {
  description = "The port every process serves `/metrics` on."
  type        = number
  default     = 9464
}

variable "monitoring_cidrs" {
  description = "The monitoring subnets allowed to scrape `/metrics` (none: nobody)."
  type        = list(string)
  default     = []
}

variable "internal_domain" {
  description = "Private DNS suffix: names are <process>.<region>.<internal_domain>."
  type        = string
  default     = "cellmesh.internal"
}

variable "edge_port" {
  description = "The edge's client port, open to everyone."
  type        = number
  default     = 7200
}

variable "internal_ports" {
  description = "Port ranges open between components, by what they serve."
  type        = map(tuple([number, number]))
  default = {
    "etcd clients and peers"       = [2379, 2380]
    "control plane console, admin" = [7100, 7101]
    "edge"                         = [7200, 7200]
    "router api and raft"          = [7300, 7301]
    "cell"                         = [7400, 7400]
  }
}

variable "zones" {
  description = "Availability zones of the subnets (two); empty takes the region's first two. Pin them in production: a new zone must not move subnets."
  type        = list(string)
  default     = []
  validation {
    condition     = length(var.zones) == 0 || length(var.zones) == 2
    error_message = "zones: name exactly two availability zones, or none."
  }
}
