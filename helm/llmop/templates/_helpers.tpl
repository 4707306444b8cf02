{{/*
Chart name, truncated to 63 characters (the DNS label limit of Kubernetes names).
*/}}
{{- define "llmop.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name: <release>-<chart>, or just <release> when it already contains the
chart name (so `helm install llmop ./helm/llmop` gives "llmop", not "llmop-llmop").
*/}}
{{- define "llmop.fullname" -}}
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

{{/*
Chart label value: name-version.
*/}}
{{- define "llmop.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every object of the chart.
*/}}
{{- define "llmop.labels" -}}
helm.sh/chart: {{ include "llmop.chart" . }}
{{ include "llmop.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: llmop
{{- end }}

{{/*
Selector labels of the operator pod. Stable across upgrades: a Deployment's selector is immutable.
*/}}
{{- define "llmop.selectorLabels" -}}
app.kubernetes.io/name: {{ include "llmop.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
Name of the operator's ServiceAccount.
*/}}
{{- define "llmop.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "llmop.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Operator image reference: repository:tag, or repository@digest when a digest is pinned.
*/}}
{{- define "llmop.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
Selector of every llmop engine pod (labels the operator's renderer puts on them).
*/}}
{{- define "llmop.engineSelectorLabels" -}}
app.kubernetes.io/name: llmop-engine
app.kubernetes.io/managed-by: llmop
{{- end }}

{{/*
Grouping of engine metrics per LLMDeployment in PromQL: "namespace, <deploymentLabel>".
*/}}
{{- define "llmop.byDeployment" -}}
{{- printf "namespace, %s" .Values.monitoring.deploymentLabel }}
{{- end }}

{{/*
The router's name: its Deployment, Service, ServiceAccount and PDB.
*/}}
{{- define "llmop.routerName" -}}
{{- printf "%s-router" (include "llmop.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels of the router pods: their own name, never the engines' (the engine Services
select `app.kubernetes.io/name: llmop-engine`).
*/}}
{{- define "llmop.routerSelectorLabels" -}}
app.kubernetes.io/name: llmop-router
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: router
{{- end }}

{{/*
Labels on the router's objects.
*/}}
{{- define "llmop.routerLabels" -}}
helm.sh/chart: {{ include "llmop.chart" . }}
{{ include "llmop.routerSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: llmop
{{- end }}

{{/*
The gateway's store: the deployed Redis's Service, or the URL given.
*/}}
{{- define "llmop.routerStoreName" -}}
{{- printf "%s-store" (include "llmop.routerName" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "llmop.routerStoreUrl" -}}
{{- $store := .Values.router.gateway.store }}
{{- if $store.deploy }}
{{- printf "redis://%s.%s.svc:6379/0" (include "llmop.routerStoreName" .) .Release.Namespace }}
{{- else }}
{{- required "router.gateway.store.url is required when router.gateway.store.deploy is false" $store.url }}
{{- end }}
{{- end }}

{{/*
Router image reference: repository:tag, or repository@digest when a digest is pinned.
*/}}
{{- define "llmop.routerImage" -}}
{{- $image := .Values.router.image }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{/*
NetworkPolicyPeers (as a list) of the operator's pods, the router's pods and Prometheus, from any
namespace: `kubernetes.io/metadata.name` is the label the API server sets on every Namespace.
*/}}
{{- define "llmop.operatorPeers" -}}
{{- $ns := dict "matchLabels" (dict "kubernetes.io/metadata.name" .Release.Namespace) }}
{{- $peers := list (dict "namespaceSelector" $ns "podSelector" (dict "matchLabels" (include "llmop.selectorLabels" . | fromYaml))) }}
{{- with .Values.networkPolicy.prometheus }}
{{- $peers = append $peers . }}
{{- end }}
{{- toJson $peers }}
{{- end }}

{{/*
LLMOP_NETWORK_POLICY: the peers of each LLMDeployment's engine NetworkPolicy, which the operator
renders (llmop.render.network_policy adds the CR's own namespace and pods).
*/}}
{{- define "llmop.enginePeers" -}}
{{- $ns := dict "matchLabels" (dict "kubernetes.io/metadata.name" .Release.Namespace) }}
{{- $api := list }}
{{- if .Values.router.enabled }}
{{- $api = append $api (dict "namespaceSelector" $ns "podSelector" (dict "matchLabels" (include "llmop.routerSelectorLabels" . | fromYaml))) }}
{{- end }}
{{- with .Values.networkPolicy.prometheus }}
{{- $api = append $api . }}
{{- end }}
{{- $api = concat $api .Values.networkPolicy.engineApiFrom }}
{{- $probe := include "llmop.operatorPeers" . | fromJsonArray }}
{{- if .Values.router.enabled }}
{{- /* The router asks a waking CR's starting pods /readyz itself (docs/router.md). */}}
{{- $probe = append $probe (dict "namespaceSelector" $ns "podSelector" (dict "matchLabels" (include "llmop.routerSelectorLabels" . | fromYaml))) }}
{{- end }}
{{- $probe = concat $probe .Values.networkPolicy.engineProbeFrom }}
{{- toJson (dict "api" $api "probe" $probe) }}
{{- end }}
