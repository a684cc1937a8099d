{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "v41flash.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name when it already contains the chart name, else release-chart. */}}
{{- define "v41flash.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "v41flash.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: stable across upgrades (a Deployment's selector is immutable). */}}
{{- define "v41flash.selectorLabels" -}}
app.kubernetes.io/name: {{ include "v41flash.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "v41flash.labels" -}}
{{ include "v41flash.selectorLabels" . }}
app.kubernetes.io/part-of: v41flash
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "v41flash.chart" . }}
{{- end }}

{{- define "v41flash.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "v41flash.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "v41flash.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
What the operator does in a namespace it watches, resource by resource, with exact verbs.
Server-side apply is a PATCH that creates a missing object, so it needs both patch and create.
*/}}
{{- define "v41flash.namespacedRules" -}}
# Its own custom resources: watch them, add/remove its finalizer and kopf's annotations, write status.
- apiGroups: ["v41flash.io"]
  resources: ["v41flashdeployments"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["v41flash.io"]
  resources: ["v41flashdeployments/status"]
  verbs: ["patch"]
# Children carry ownerReferences with blockOwnerDeletion; OwnerReferencesPermissionEnforcement checks this.
- apiGroups: ["v41flash.io"]
  resources: ["v41flashdeployments/finalizers"]
  verbs: ["update"]
# Children: server-side apply, list by label to prune, delete what is no longer desired; get: an object
# of a child's name that is not ours is never adopted (reconcile.name_collisions), and a workload is read by
# name when the watch cache is cold; the workloads are watched (their status, without reading them every pass).
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Rollouts: each revision's spec is recorded in a ControllerRevision (create-only: its data is immutable),
# listed by label each rollout pass, and deleted once neither live nor the previous serving revision.
- apiGroups: ["apps"]
  resources: ["controllerrevisions"]
  verbs: ["get", "list", "create", "delete"]
- apiGroups: [""]
  resources: ["services", "serviceaccounts"]
  verbs: ["get", "list", "create", "patch", "delete"]
# spec.startup.weightCache.prefetch: the weight prefetcher's DaemonSet
- apiGroups: ["apps"]
  resources: ["daemonsets"]
  verbs: ["get", "list", "create", "patch", "delete"]
# get: the planner reads a capacity profile from a ConfigMap named in the spec.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "create", "patch", "delete"]
# The front's HorizontalPodAutoscaler (spec.routing.front)
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list", "create", "patch", "delete"]
# Per deployment: only its router reaches its engines, only the operator scrapes them.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "create", "patch", "delete"]
# spec.routing.mode: Gateway. The InferencePool and HTTPRoute children (apply, prune). The endpoint picker's Role
# grants get/list/watch on pods, InferencePools and InferenceObjectives; RBAC only lets the operator grant what
# it holds itself.
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["inference.networking.x-k8s.io"]
  resources: ["inferenceobjectives"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["httproutes"]
  verbs: ["get", "list", "create", "patch", "delete"]
# Multi-node replicas on GB200/GB300 NVL72: the IMEX ComputeDomain of each such workload (apply, prune).
- apiGroups: ["resource.nvidia.com"]
  resources: ["computedomains"]
  verbs: ["get", "list", "create", "patch", "delete"]
# spec.gpu.allocation: DRA. The ResourceClaimTemplate of each engine workload's GPUs (apply, prune).
- apiGroups: ["resource.k8s.io"]
  resources: ["resourceclaimtemplates"]
  verbs: ["get", "list", "create", "patch", "delete"]
# Pods: observed for status and metrics, annotated with a deletion cost before a scale-down, deleted to replace a
# hung or straggling engine (controller/engine_health.py). get/list/watch are also what the router's Role grants,
# and RBAC only lets the operator grant what it holds itself.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{/* Cluster-scoped reads kopf uses to notice CRDs (and, when namespaced, namespaces) appearing or going. */}}
{{- define "v41flash.observerRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
# get: the planner reads the node of an engine pod that is not Ready (NodeNotReady); without it, it cannot tell
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get"]
{{- if .Values.watchNamespaces }}
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
{{- end }}
